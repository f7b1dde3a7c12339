"""Packed varlen: a stream's requests laid end to end in rows with segment ids (``regimes.pack``),
the workload that carries a layout, the runner that takes one per step, and how the report prices
a packed stream against the same requests padded."""

from __future__ import annotations

import numpy as np
import pytest

import attention_impls
from attnbench.backends import here
from attnbench.core import masks
from attnbench.core.regimes import (
    PACKED,
    PackedStep,
    pack,
    regime_reason,
    run_regime,
    runner_template,
)
from attnbench.core.workload import Workload
from attnbench.report import streams
from tests.conftest import FRAMEWORKS

needs_jax = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")
needs_torch = pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")

SMALL = Workload(batch=2, q_heads=2, seq_q=128, head_dim=16, causal=True)


# -- packing -------------------------------------------------------------------------------------
def test_pack_lays_requests_in_arrival_order_row_by_row():
    steps = [(60, 50), (30, 100), (128, 10), (20, 5)]  # batch 2: eight requests in arrival order
    out = pack(steps, [0, 0, 0, 0], batch=2, max_len=128)
    assert [s.rows for s in out] == [((60, 50), (30,)), ((100,), (128,)), ((10, 20, 5), ())]
    assert [n for s in out for n in s.sizes] == [60, 50, 30, 100, 128, 10, 20, 5]  # none lost, in order
    assert all(sum(row) <= 128 for s in out for row in s.rows)
    assert all(len(s.rows) == 2 for s in out)  # every step is batch rows; the last's empty row pads


def test_pack_keeps_each_window_apart():
    steps = [(10,), (10,), (10,), (10,)]
    out = pack(steps, [0, 0, 1, 1], batch=1, max_len=100)
    assert out == [PackedStep(((10, 10),), 0), PackedStep(((10, 10),), 1)]


def test_pack_takes_bare_lengths_and_refuses_what_cannot_fit():
    assert pack([64, 64], [0, 0], batch=2, max_len=128)[0].rows == ((64, 64), (64, 64))
    with pytest.raises(ValueError, match="a request of 200 tokens cannot be packed in rows of 128"):
        pack([(200,)], [0], batch=1, max_len=128)


# -- the workload of one packed step -------------------------------------------------------------
def test_packed_workload_has_its_layouts_segment_ids():
    w = SMALL.replace(packed=((60, 50), (128,)))
    q_ids, kv_ids = w.segment_ids()
    assert q_ids.shape == (2, 128) and (q_ids == kv_ids).all()
    assert list(np.unique(q_ids[0])) == [-1, 0, 1] and (q_ids[0, 110:] == masks.PADDING_SEGMENT).all()
    assert (q_ids[1] == 0).all()
    assert w.mask == "causal+packed" and w.segmented and w.packs_documents
    assert w.mask_features == ("segment_ids",)
    # each document its own causal square; the row's padding tail sees itself
    tail = 18 * 19 // 2
    assert w.pairs == 60 * 61 // 2 + 50 * 51 // 2 + tail + 128 * 129 // 2
    assert w.at_length(64).packed is None  # a layout belongs to one step
    assert "packed" not in SMALL.to_dict() and SMALL.describe() == SMALL.replace(packed=None).describe()


@pytest.mark.parametrize("changes,message", [
    ({"packed": ((128,),)}, r"one tuple of document lengths per batch row \(2 rows\)"),
    ({"packed": ((0,), (1,))}, "row 0: document lengths must be positive integers"),
    ({"packed": ((100, 29), (1,))}, "row 0: documents of 129 tokens exceed seq_q=128"),
    ({"packed": ((1,), (1,)), "documents": 2}, "each set segment ids: choose one"),
    ({"packed": ((1,), (1,)), "seq_k": 256}, "needs seq_q == seq_k"),
])
def test_a_bad_layout_is_refused_naming_what_is_wrong(changes, message):
    with pytest.raises(ValueError, match=message):
        SMALL.replace(**changes)


def test_packed_regime_refuses_decode_and_a_workload_with_its_own_segment_ids():
    decode = SMALL.replace(seq_q=1, seq_k=128)
    assert "packs prefill and training sequences" in regime_reason(decode, PACKED)
    assert "sets the segment ids itself" in regime_reason(SMALL.replace(documents=3), PACKED)
    assert regime_reason(SMALL, PACKED) is None and regime_reason(decode, "dynamic") is None
    with pytest.raises(ValueError, match="packs prefill and training"):
        runner_template(decode, PACKED)
    assert runner_template(SMALL, PACKED).packed == ((128,), (128,))  # asks the kernel for segment ids
    assert runner_template(SMALL, "static") is SMALL


def test_a_kernel_without_segment_ids_refuses_the_packed_runner():
    mgpu = attention_impls.get("jax-pallas-mgpu-attention")
    assert "takes no segment ids" in mgpu.feature_reason(runner_template(SMALL, PACKED))
    assert mgpu.feature_reason(SMALL) is None


# -- running a packed stream ---------------------------------------------------------------------
class Recorder:
    """A runner that records what it is asked to run, as ``backends.base.Runner`` is asked."""

    execution = "eager"

    def __init__(self):
        self.asked = []

    def prepare(self, length, packed=None):
        pass

    def step(self, length, packed=None):
        self.asked.append((length, packed))

    def compiles(self):
        return 0

    def compile_seconds(self):
        return 0.0

    def cache_hits(self):
        return 0


def test_run_regime_packs_the_stream_and_counts_its_padding_and_flops():
    steps, windows = [(60, 50), (30, 100), (128, 10)], [0, 0, 1]
    runner = Recorder()
    result = run_regime("rec", runner, SMALL, PACKED, steps, windows=windows)
    assert runner.asked == [(128, ((60, 50), (30,))), (128, ((100,), ())), (128, ((128,), (10,)))]
    assert result.planned_steps == 3 and [t.window for t in result.trace] == [0, 0, 1]
    assert result.shapes == (128,) and all(t.padded_length == 128 for t in result.trace)
    assert [t.useful_tokens for t in result.trace] == [140, 100, 138]
    assert result.padding_waste == pytest.approx(1 - 378 / (3 * 2 * 128))
    per_doc = {n: SMALL.at_length(n).flops / SMALL.batch for n in (60, 50, 30, 100, 128, 10)}
    assert result.trace[0].real_flops == pytest.approx(per_doc[60] + per_doc[50] + per_doc[30])
    assert 0 < result.padding_flops_waste < 1


def test_a_budget_cuts_a_packed_stream_and_says_how_many_were_planned():
    result = run_regime("rec", Recorder(), SMALL, PACKED, [(60, 50), (30, 100), (128, 10)],
                        windows=[0, 0, 1], budget_s=0.0)
    assert len(result.trace) == 1 and result.planned_steps == 3


@needs_jax
def test_jax_runs_a_packed_stream_on_one_compile_whatever_its_layouts():
    kernel = attention_impls.get("jax-xla")
    runner = here.make_runner(kernel, runner_template(SMALL, PACKED))
    steps = [(60, 50), (30, 100), (128, 10), (20, 5), (64, 64)]
    result = run_regime(kernel.name, runner, SMALL, PACKED, steps, windows=[0] * 5)
    assert len(result.trace) >= 3 and result.compiles == 1  # segment ids are arguments, not shapes
    assert [t.compiled for t in result.trace] == [True] + [False] * (len(result.trace) - 1)


@needs_torch
def test_torch_packed_step_computes_each_document_alone():
    """The packed step's output at each document's rows is that document run alone: segment ids kept
    the documents apart (torch-blockwise-flash, which skips tiles no document shares)."""
    kernel = attention_impls.get("torch-blockwise-flash")
    w = Workload(batch=1, q_heads=2, seq_q=96, head_dim=16, causal=True, packed=((40, 30),))
    q, k, v = (np.random.default_rng(i).standard_normal(w.q_shape).astype(np.float32) for i in range(3))
    ids = w.segment_ids()[0]
    packed = here.run_numpy(kernel, q, k, v, causal=True, scale=0.25, q_segment_ids=ids, kv_segment_ids=ids)
    for lo, hi in ((0, 40), (40, 70)):
        alone = here.run_numpy(kernel, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], causal=True, scale=0.25)
        np.testing.assert_allclose(packed[:, lo:hi], alone, rtol=1e-4, atol=1e-5)


# -- pricing a packed stream ---------------------------------------------------------------------
def _case(regime, planned, ran, usd_step, usd_with, per_mtok, compiles=1):
    return {f"{regime}:planned": planned, f"{regime}:steps": ran, f"{regime}:usd_per_step": usd_step,
            f"{regime}:usd_per_step_with_compiles": usd_with,
            f"{regime}:usd_per_million_useful_tokens_with_compiles": per_mtok, f"{regime}:compiles": compiles,
            f"{regime}:traffic": "azure-code"}


def test_a_packed_stream_is_priced_per_step_of_the_stream_it_packed():
    # 200 stream steps packed into 71: each packed step serves 200/71 of a stream step's tokens
    case = _case(PACKED, 71, 71, 2.0, 2.5, 10.0)
    assert streams.packed_per_step(case, PACKED, 200) == pytest.approx(71 / 200)
    figures = streams.stream_figures(case, PACKED, 1024, 200)
    assert figures["measured_steps"] == 200  # every request of the stream was served: nothing modelled
    assert figures["steady_usd"] == pytest.approx(2.0 * 71 / 200)
    assert streams.modelled_beyond(case, PACKED, 200, 200) is None
    # the measured stream priced back is what was measured
    assert streams.price_stream(**figures, steps=200)["usd_per_mtok"] == pytest.approx(10.0)
    # a longer stream pays the one compile once: cheaper per token, never dearer
    assert streams.price_stream(**figures, steps=2000)["usd_per_mtok"] < 10.0
    cut = _case(PACKED, 71, 20, 2.0, 2.5, 10.0)
    assert streams.modelled_beyond(cut, PACKED, 200, 200) == round(20 * 200 / 71)
    assert streams.packed_per_step(_case("static", 200, 200, 1, 1, 1), "static", 200) == 1.0
