"""The published figures in the verdict and the report (attnbench/report/published.py), on synthetic
tables: a chip's figure stands only beside its own chip's compiled rows, with its source."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnbench.published import shapes
from attnbench.published.table import COLUMNS
from attnbench.report import published, verdict

SHAPE = shapes.ALIGNED[1]  # B2 Hq16 S8192 D128 causal bf16


def _published_row(kernel, ms, *, device="TPU v6e", kind="tpu_v6_lite", target="tpu-v6e", config="{}",
                   source="openxla/tokamax@783ea95704a5", shape=SHAPE, **more) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(evidence="published", source=source,
               source_file=f"tokamax/data/autotuning/{kind}/{kernel}.json", source_url="",
               device_kind=kind, device=device, hardware_profile=target, target=target,
               op="op", kernel=kernel, implementation="x", **{"pass": "fwd"}, batch=shape.batch,
               q_heads=shape.q_heads, kv_heads=shape.kv_heads, seq_q=shape.seq_q, seq_k=shape.seq_k,
               head_dim=shape.head_dim, head_dim_v=shape.head_dim, dtype=shape.dtype, causal=shape.causal,
               mask="causal", logits_soft_cap=float("nan"), precision="DEFAULT", config=config,
               n_evaluations=5, median_ms=ms, min_ms=ms, max_ms=ms, spread=0.0, compile_ms=1.0, lower_ms=1.0,
               peak_memory_mb=1.0, flops=shape.flops, tflops_per_s=shape.flops / (ms / 1e3) / 1e12, note="")
    row.update(more)
    return row


def _record(target, impl, *, config="", status="ok", shape=SHAPE) -> dict:
    return {"target": target, "impl": impl, "workload": "custom", "phase": "prefill", "mode": "fwd",
            "batch": shape.batch, "q_heads": shape.q_heads, "kv_heads": shape.kv_heads, "seq_q": shape.seq_q,
            "seq_k": shape.seq_k, "head_dim": shape.head_dim, "dtype": shape.dtype, "causal": shape.causal,
            "execution": "compiled", "status": status, "fits": True, "peak_bytes": 4e8,
            "kernel_evidence": "tpu_custom_call: splash_mha_fwd_no_residuals", "library_config": config}


TUNED = json.dumps({"block_q": 2048, "block_kv": 2048, "block_kv_compute": 512})


@pytest.fixture
def tables():
    figures = pd.DataFrame([
        _published_row("jax-tokamax-mosaic-tpu", 2.43, config=TUNED),
        _published_row("jax-tokamax-xla-chunked", 8.18),
        _published_row("jax-tokamax-mosaic-tpu", 9.9, config=TUNED, source="tokamax 0.0.12 wheel"),
        _published_row("jax-tokamax-cudnn", 0.873, device="NVIDIA H100 80GB HBM3",
                       kind="nvidia_h100_80gb_hbm3", target="h100-sxm"),
        _published_row("jax-tokamax-mosaic-tpu", 1.0, config=TUNED, shape=shapes.ALIGNED[0]),  # another shape
        _published_row("jax-tokamax-mosaic-tpu", 0.5, config=TUNED, **{"pass": "vjp"}),  # another pass
    ])
    heuristic = "PallasMosaicTpuFlashAttention block_q=128,block_kv=128,block_kv_compute=128"
    records = pd.DataFrame([
        _record("tpu-v6e", "jax-tokamax-mosaic-tpu", config=heuristic),
        _record("tpu-v6e", "jax-tokamax-xla-chunked", config="XlaChunkedDotProductAttention no config"),
        _record("h200", "jax-tokamax-cudnn"),
        _record("tpu-v6e", "jax-xla", shape=SHAPE.replace(batch=3)),  # not an aligned shape: no row
    ])
    return records, figures


def test_a_chips_published_figure_stands_beside_its_own_compiled_rows_with_its_source(tables):
    records, figures = tables
    rows = published.published_verdicts(records, figures).set_index("machine")
    assert list(rows.index) == ["h200", "tpu-v6e"] and set(rows["basis"]) == {published.BASIS}
    v6e = rows.loc["tpu-v6e"]
    # fastest first; the repository's figure, not the wheel's; this shape and pass only
    assert v6e["published"].startswith("jax-tokamax-mosaic-tpu 2.43 ms")
    assert "at block_q=2048,block_kv=2048,block_kv_compute=512" in v6e["published"]
    assert "; jax-tokamax-xla-chunked 8.18 ms" in v6e["published"] and "9.9" not in v6e["published"]
    assert v6e["published_source"].startswith(
        "openxla/tokamax@783ea95704a5: tokamax/data/autotuning/tpu_v6_lite")
    assert "takes 3.4x its time" in v6e["sentence"] and "not measured here" in v6e["sentence"]
    # compiled at Tokamax's heuristic, published at its tuned tiles: said, not hidden
    assert "compiled at Tokamax's own choice here (block_q=128" in v6e["reasons"]
    assert "published at block_q=2048" in v6e["reasons"]
    # the H100's figure is never put beside the H200's compile
    h200 = rows.loc["h200"]
    assert pd.isna(h200["published"]) and "no published timing for this chip" in h200["sentence"]


def test_the_verdicts_paper_only_rows_never_hold_the_published_rows(tables):
    records, figures = tables
    rows = published.published_verdicts(records, figures)
    assert verdict.paper_only(rows).empty and verdict.headline(rows).empty


def test_on_the_chip_compares_each_chips_kernels_at_the_aligned_shapes(tables):
    _, figures = tables
    chips = published.on_the_chip(figures).set_index(["chip", "shape"])
    v6e = chips.loc[("TPU v6e", shapes.label(SHAPE))]
    assert v6e["jax-tokamax-mosaic-tpu"] == "2.43 ms" and v6e["jax-tokamax-xla-chunked"] == "8.18 ms"
    assert v6e["xla chunked / flash"] == "3.37x" and v6e["jax-tokamax-triton"] == "-"
    assert v6e["fastest"].startswith("jax-tokamax-mosaic-tpu (")
    h100 = chips.loc[("NVIDIA H100 80GB HBM3", shapes.label(SHAPE))]
    assert h100["xla chunked / flash"] == "-" and h100["jax-tokamax-cudnn"] == "0.873 ms"


def test_tile_spread_counts_the_winning_tiles_per_chip(tables):
    _, figures = tables
    spread = published.tile_spread(figures)
    row = spread.iloc[0]
    assert (row["chip"], row["tiles (block_q x block_kv)"], row["shapes"]) == ("TPU v6e", "2048x2048", 2)


def test_nothing_published_is_no_rows_and_no_section(tmp_path):
    assert published.load_published(str(tmp_path)).empty
    assert published.published_part(str(tmp_path)) is None
    assert published.on_the_chip(published.load_published(str(tmp_path))).empty


def _run_record(device, impl, ms, *, shape=SHAPE, status="ok", regime="static") -> dict:
    return {"impl": impl, "device": device, "status": status, "regime": regime, "mode": "fwd",
            "seconds_per_step": ms / 1e3, "batch": shape.batch, "q_heads": shape.q_heads,
            "kv_heads": shape.kv_heads, "seq_q": shape.seq_q, "seq_k": shape.seq_k,
            "head_dim": shape.head_dim, "dtype": shape.dtype, "causal": shape.causal}


def test_a_run_on_a_chip_is_measured_beside_that_chips_published_figure_only(tables, tmp_path):
    _, figures = tables
    run = tmp_path / "runs" / "20261207T000000Z-tpu-vm"
    run.mkdir(parents=True)
    pd.DataFrame([_run_record("TPU v6 lite", "jax-tokamax-mosaic-tpu", 2.5),
                  _run_record("TPU v6 lite", "jax-xla", 9.0, status="error"),  # not ok: left out
                  # not an aligned shape: left out
                  _run_record("TPU v6 lite", "jax-xla-chunked", 7.0, shape=SHAPE.replace(batch=3)),
                  _run_record("NVIDIA H200", "jax-tokamax-cudnn", 0.7)]).to_csv(run / "records.csv",
                                                                                index=False)
    measured = published.measured_at_aligned(str(tmp_path))
    assert list(measured["kernel"]) == ["jax-tokamax-mosaic-tpu", "jax-tokamax-cudnn"]
    chips = published.measured_beside(published.on_the_chip(figures), figures, measured)
    chips = chips.set_index(["chip", "shape"])["measured here"]
    assert chips.loc[("TPU v6e", shapes.label(SHAPE))] == "jax-tokamax-mosaic-tpu 2.5 ms"
    assert chips.loc[("TPU v6e", shapes.label(shapes.ALIGNED[0]))] == "-"  # not measured at that shape
    # the H200's time is not the H100's: no published H200 row, and none put beside the H100's
    assert chips.loc[("NVIDIA H100 80GB HBM3", shapes.label(SHAPE))] == "-"


def test_run_published_shapes_are_the_aligned_ones_and_refuse_other_shape_options():
    from attnbench.cli import build_parser
    from attnbench.cli_run import run_workloads

    parser = build_parser()
    args = parser.parse_args(["run", "--published-shapes", "--dtype", "bfloat16"])
    assert run_workloads(args) == list(shapes.ALIGNED)
    for extra in (["--seq", "1024"], ["--heads", "4"], ["--dtype", "float32"], ["--mode", "fwd_bwd"]):
        args = parser.parse_args(["run", "--published-shapes", "--dtype", "bfloat16", *extra])
        with pytest.raises(ValueError, match="published-shapes are the aligned shapes"):
            run_workloads(args)


# -- the committed results: what issue 53 asked of them ------------------------------------------------
def test_the_committed_records_hold_tokamaxs_kernels_on_the_chips_with_their_evidence():
    from attnbench.report.compiled import load_compiled_records

    records = load_compiled_records("results")
    tokamax = records[records["impl"].str.startswith("jax-tokamax-") & (records["status"] == "ok")]
    mosaic = tokamax[tokamax["impl"] == "jax-tokamax-mosaic-tpu"]
    assert {"tpu-v5e", "tpu-v6e"} <= set(mosaic["target"])
    assert mosaic["kernel_evidence"].str.startswith("tpu_custom_call: splash_mha_fwd").all()
    on_h200 = tokamax[tokamax["target"] == "h200"]
    calls = {"jax-tokamax-triton": "__gpu$xla.gpu.triton", "jax-tokamax-mosaic-gpu": "mosaic_gpu_v2",
             "jax-tokamax-cudnn": "__cudnn$fmhaSoftmax"}
    for impl, call in calls.items():
        rows = on_h200[on_h200["impl"] == impl]
        assert len(rows) and rows["kernel_evidence"].str.startswith(call).all(), impl
    refused = records[(records["impl"] == "torch-sdpa-flash") & (records["platform"] == "tpu")]
    assert len(refused) and (refused["status"] == "unsupported").all()
    assert refused["reason"].str.contains("No jellyfish device found").all()


def test_the_committed_published_table_and_the_verdicts_published_figures():
    from attnbench.report.compiled import load_compiled_records

    figures = published.load_published("results")
    assert len(figures) >= 100 and figures["device_kind"].nunique() >= 2
    assert (figures["source"] != "").all() and (figures["source_file"] != "").all()
    assert (figures["evidence"] == "published").all()
    rows = published.published_verdicts(load_compiled_records("results"), figures)
    rows = rows.set_index(["machine", "seq_len"])
    v6e = rows.loc[("tpu-v6e", 8192)]
    v6e = v6e[v6e["workload"] == "B2 Hq16 D128 causal bf16"].iloc[0]
    assert v6e["published"].startswith("jax-tokamax-mosaic-tpu ")
    assert v6e["published_source"].startswith(
        "openxla/tokamax@783ea95704a5: tokamax/data/autotuning/tpu_v6_lite/")
    h200 = rows.loc[("h200", 8192)].iloc[0]
    assert pd.isna(h200["published"]) and "no published timing" in h200["sentence"]
