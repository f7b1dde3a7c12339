"""The tuner (attnbench/run/tune.py), its file (attnbench/results/tuned.py) and the kernels' search
spaces (``search_space`` in each tiled kernel's file): what is searched, what is refused with a reason,
what is never kept, and the sweep running each kernel at its kept config. No timing is asserted: the
choice between candidates is tested on given round medians."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import attention_impls
from attention_impls.base import SearchSpace, config_text, parse_config
from attnbench.asv import sizes
from attnbench.cli import main
from attnbench.measure.engine import Case, Options
from attnbench.results import tuned
from attnbench.run import tune

HOST_TILED = ("jax-blockwise-flash", "jax-xla-chunked", "torch-blockwise-flash", "torch-flex-attention",
              "torch-xla-blockwise-flash")


def test_every_tiled_kernel_declares_its_defaults_among_at_least_three_candidates():
    for name in HOST_TILED:
        space = attention_impls.get(name).search_space
        assert space is not None and space.defaults in space.candidates and len(space.candidates) >= 3, name


def test_the_defaults_are_the_tiles_the_kernels_ran_at_before_tuning():
    """Untuned figures stay comparable with the history: the defaults are the old constants."""
    assert dict(attention_impls.get("jax-blockwise-flash").search_space.defaults) == {"block_q": 128,
                                                                                      "block_k": 128}
    assert dict(attention_impls.get("jax-xla-chunked").search_space.defaults) == {"query_chunk": 256,
                                                                                  "key_chunk": 512}
    assert dict(attention_impls.get("torch-flex-attention").search_space.defaults) == {"block_size": 128}


def test_a_tile_longer_than_its_length_is_refused_with_the_reason_but_the_default_never():
    impl = attention_impls.get("jax-blockwise-flash")
    decode = sizes.FORWARD.replace(seq_q=1, seq_k=1024)
    refused = {config_text(c): why for c, why in impl.candidates(decode) if why}
    assert refused["block_q=256,block_k=256"].startswith("block_q=256 is longer than the 1 positions")
    assert "block_q=128,block_k=128" not in refused  # the default pads a decode too, and is measured
    assert sum(why is None for _, why in impl.candidates(decode)) >= 3


@pytest.mark.parametrize("text, says", [
    ("block_x=64", "has no knob block_x"), ("block_q=0", "positive integer"),
    ("block_q", "is not knob=positive-integer"), ("block_q=6x", "is not knob=positive-integer"),
    ("block_q=64,block_q=32", "named twice"), ("block_q=-4", "is not knob=positive-integer")])
def test_a_malformed_config_is_refused_naming_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        attention_impls.get("jax-blockwise-flash").with_config(text)


def test_a_config_leaves_the_registry_instance_at_its_defaults():
    impl = attention_impls.get("jax-xla-chunked")
    twin = impl.with_config("key_chunk=1024")
    assert twin.config_now == (("query_chunk", 256), ("key_chunk", 1024))
    assert impl.config == () and impl.knob("key_chunk") == 512
    with pytest.raises(ValueError, match="no tile knobs"):
        attention_impls.get("jax-xla").with_config("block_q=64")


def test_a_search_space_whose_defaults_are_no_candidate_is_refused():
    with pytest.raises(ValueError, match="must be one of the candidates"):
        SearchSpace(defaults=(("b", 1),), candidates=((("b", 2),),))
    assert parse_config("block_q=64, block_k=128") == (("block_q", 64), ("block_k", 128))


@pytest.mark.parametrize("name, config", [
    ("jax-blockwise-flash", "block_q=64,block_k=256"), ("jax-xla-chunked", "query_chunk=128,key_chunk=256"),
    ("torch-blockwise-flash", "block_q=256,block_k=64"), ("torch-flex-attention", "block_size=64")])
def test_every_candidate_computes_the_same_attention(name, config):
    """A config changes the tiles, never the answer: checked against the float64 reference with a
    sliding window and soft cap, at a length no tile divides."""
    from attention_impls.reference_float64 import attention_fwd
    from attnbench.backends import here

    impl = attention_impls.get(name)
    if here.framework_missing(impl):
        pytest.skip(f"needs {impl.framework}, not installed in this environment")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 300, 4, 32)).astype(np.float32) for _ in range(3))
    expected = attention_fwd(q, k, v, causal=True, window=96, softcap=20.0)
    got = here.run_numpy(impl.with_config(config), q, k, v, causal=True, scale=32 ** -0.5, window=96,
                         softcap=20.0)
    assert np.abs(got - expected).max() < 2e-5


def _rounds(values: list[float]) -> dict[int, float]:
    return {i + 1: v for i, v in enumerate(values)}


def _entry(medians: dict[str, list[float]], rows=None) -> dict:
    impl = attention_impls.get("jax-blockwise-flash")
    rows = rows or {c: {"config": c, "status": "ok", "reason": None} for c in medians}
    return tune._entry("jax-blockwise-flash", impl, sizes.FORWARD, impl.search_space.defaults, rows,
                       {c: _rounds(v) for c, v in medians.items()}, tune.TunePlan(rounds=12), 1.0)


def test_the_fastest_candidate_is_kept_only_when_decided_faster_than_the_defaults():
    base = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.2, 0.9, 1.0, 1.1, 1.0, 0.95]
    faster = [b * 0.8 for b in base]
    fastest = [b * (0.7 if i % 2 else 0.85) for i, b in enumerate(base)]  # lower median, one wide
    entry = _entry({"block_q=128,block_k=128": base, "block_q=64,block_k=64": faster,
                    "block_q=256,block_k=256": fastest})
    assert entry["kept"] == "block_q=256,block_k=256"
    assert entry["why"].startswith("fastest candidate, decided faster than the defaults")
    kept = next(c for c in entry["candidates"] if c["config"] == entry["kept"])
    assert kept["high"] < 1.0 and kept["rounds"] == 12


def test_a_candidate_within_noise_of_the_defaults_leaves_the_defaults():
    base = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.2, 0.9, 1.0, 1.1, 1.0, 0.95]
    noisy = [b * (0.9 if i % 3 else 1.05) for i, b in enumerate(base)]  # faster mostly, not always
    entry = _entry({"block_q=128,block_k=128": base, "block_q=64,block_k=64": noisy})
    assert entry["kept"] == "block_q=128,block_k=128" and entry["why"].startswith("no candidate decided")


def test_a_candidate_that_fails_or_breaks_numerics_is_recorded_and_never_kept():
    """In-process, through the real prepare and round path, with a stub whose block=3 cannot build,
    whose block=4 returns zeros and whose block=8 every workload refuses."""
    workload = sizes.FORWARD.replace(seq_q=64, seq_k=64, q_heads=2, kv_heads=2)
    entry = tune.tune_group("tests.stub_impls:TiledStub", workload, tune.TunePlan(rounds=2, window_s=0.01),
                            in_process=True)
    by_config = {c["config"]: c for c in entry["candidates"]}
    assert by_config["block=3"]["status"] == "error" and "cannot be built" in by_config["block=3"]["reason"]
    assert by_config["block=4"]["status"] == "numerics-failed"
    assert "against the float64 reference" in by_config["block=4"]["reason"]
    assert by_config["block=8"]["status"] == "refused" and "a test's reason" in by_config["block=8"]["reason"]
    assert entry["kept"] in ("block=1", "block=2")
    assert by_config["block=1"].get("median_s") and by_config["block=2"].get("median_s")


def _write_file(tmp_path, machine="m", kept="block_q=256,block_k=256"):
    workload = sizes.FORWARD.replace(seq_q=256, seq_k=256)
    release = tuned.release("jax")
    key = tuned.key("jax-blockwise-flash", workload, release)
    entry = {"kernel": "jax-blockwise-flash", "workload": workload.describe(), "release": release,
             "kept": kept, "defaults": "block_q=128,block_k=128", "why": "a test",
             "candidates": [{"config": kept, "status": "ok", "ratio": 0.8, "low": 0.7, "high": 0.9},
                            {"config": "block_q=64,block_k=64", "status": "refused", "reason": "r"}]}
    tuned.write(str(tmp_path), machine, {key: entry})
    return workload


def test_the_sweep_runs_a_tuned_kernel_at_its_kept_config_and_times_the_defaults_beside_it(tmp_path):
    workload = _write_file(tmp_path)
    entries = tuned.read(str(tmp_path), "m")
    static = tuned.tuned_case(Case("jax-blockwise-flash", workload), entries)
    assert static.config == (("block_q", 256), ("block_k", 256)) and static.config_source == "tuned"
    assert static.with_defaults and static.key == Case("jax-blockwise-flash", workload).key
    dynamic = tuned.tuned_case(Case("jax-blockwise-flash", workload, Options(regime="dynamic")), entries)
    assert dynamic.config == static.config and not dynamic.with_defaults
    other = tuned.tuned_case(Case("jax-blockwise-flash", workload.replace(seq_q=512, seq_k=512)), entries)
    assert other.config == () and other.config_source == "defaults"  # not tuned there
    kept_defaults = _write_file(tmp_path, machine="n", kept="block_q=128,block_k=128")
    same = tuned.tuned_case(Case("jax-blockwise-flash", kept_defaults), tuned.read(str(tmp_path), "n"))
    assert same.config == () and same.config_source == "tuned" and not same.with_defaults


def test_the_tuning_file_is_merged_atomically_and_a_foreign_file_is_refused(tmp_path):
    """Not a .json file: asv reads every *.json under results/ as a result file."""
    _write_file(tmp_path)
    other = sizes.FORWARD.replace(seq_q=1024, seq_k=1024)
    key = tuned.key("jax-blockwise-flash", other, "jax 0")
    tuned.write(str(tmp_path), "m", {key: {"kept": "block_q=64"}})
    assert len(tuned.read(str(tmp_path), "m")) == 2
    assert [f for f in os.listdir(tmp_path / "tuning") if f.startswith(".")] == []
    assert tuned.machines(str(tmp_path)) == ["m"]
    assert not [f for f in os.listdir(tmp_path / "tuning") if f.endswith(".json")]  # asv would read it
    (tmp_path / "tuning" / "bad.tuning").write_text(json.dumps({"entries": []}))
    with pytest.raises(ValueError, match="is not a tuning file"):
        tuned.read(str(tmp_path), "bad")


def test_the_report_lists_what_was_kept_and_reads_only(tmp_path):
    from attnbench.report.tuning import tuning_table

    _write_file(tmp_path)
    before = (tmp_path / "tuning" / "m.tuning").read_bytes()
    [row] = tuning_table(str(tmp_path)).to_dict("records")
    assert row["kept"] == "block_q=256,block_k=256" and row["kept vs defaults"] == "0.80x [0.70-0.90]"
    assert row["refused"] == 1 and row["measured"] == 1
    assert (tmp_path / "tuning" / "m.tuning").read_bytes() == before


@pytest.mark.parametrize("argv, says", [
    (["tune", "--impl", "nope"], "unknown implementation 'nope'"),
    (["tune", "--impl", "jax-xla"], "jax-xla has no tile knobs to tune"),
    (["tune", "--budget", "0"], "--budget must be more than 0"),
    (["run", "--impl", "jax-blockwise-flash", "--config", "block_q=x"], "malformed config"),
    (["run", "--impl", "jax-blockwise-flash", "jax-xla", "--config", "block_q=64"], "exactly one"),
    (["run", "--impl", "jax-blockwise-flash", "--config", "tile=64"], "has no knob tile")])
def test_bad_tuning_input_gets_one_line_and_exit_2(argv, says, capsys, tmp_path):
    assert main(argv + (["--results", str(tmp_path)] if argv[0] == "tune" else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_a_step_across_a_tile_config_change_is_explained_as_a_setting_change():
    import pandas as pd

    from attnbench.results.judge import config_changed

    rows = pd.DataFrame({"config": [None, "block_q=128,block_k=128", "block_q=256,block_k=256"]})
    assert config_changed(rows, 0, 1, "jax-blockwise-flash") == ""  # unrecorded: the defaults, as before
    assert config_changed(rows, 1, 2, "jax-blockwise-flash") == (
        "tile config block_q=128,block_k=128 -> block_q=256,block_k=256 (results/tuning/)")
    assert config_changed(pd.DataFrame({"config": [None, ""]}), 0, 1, "jax-xla") == ""  # no knobs


def test_a_round_times_a_tuned_kernel_and_its_defaults_side_by_side():
    """``with_defaults``: the round answers the defaults' window beside the tuned one, and pooling keeps
    them by round id (``defaults_round_*``), as the verdict pairs them."""
    from attnbench.measure.figures import pool_rounds
    from attnbench.measure.round_timing import forget, time_round
    from attnbench.run.adaptive import RoundValue, round_values

    workload = sizes.FORWARD.replace(seq_q=128, seq_k=128, q_heads=2, kv_heads=2)
    case = Case("jax-blockwise-flash", workload, config=(("block_q", 64), ("block_k", 64)),
                config_source="tuned", with_defaults=True)
    try:
        [answer] = time_round([(case, 1)], 0.01, 3)
    finally:
        forget()
    assert answer["status"] == "ok" and answer["median_s"] > 0 and answer["defaults_median_s"] > 0
    record = {"seconds_per_step": 1.0, "timing_samples_s": "[1.0]"}
    values = [RoundValue(0, 1.0), RoundValue(1, 1.0, defaults_median_s=2.0), RoundValue(2, 1.1,
                                                                                     defaults_median_s=2.1)]
    pooled = pool_rounds(record, values, stopped="settled", complete=True)
    assert json.loads(pooled["defaults_round_ids"]) == [1, 2]
    assert [v.defaults_median_s for v in round_values(pooled)] == [None, 2.0, 2.1]


def test_the_verdict_names_the_tuned_configs_and_says_when_tuning_changed_the_answer():
    """Tuned, forced wins on paper; at defaults (timed beside it each round) it loses: the row says both."""
    from attnbench.report import answers, verdict_display
    from attnbench.report.tuning import tuning_columns

    def case(impl, label, steps, defaults=None, config="", source=""):
        rounds = {i + 1: s for i, s in enumerate(steps)}
        return {"implementation": impl, "label": label, "rounds": rounds, "config": config,
                "config_source": source,
                "defaults_rounds": {i + 1: s for i, s in enumerate(defaults)} if defaults else {}}

    drift = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 0.75, 1.05, 0.95, 1.2, 0.85, 1.15]
    forced = case("jax-blockwise-flash", "forced-flash", [0.8 * d for d in drift], [1.3 * d for d in drift],
                  "block_q=256,block_k=256", "tuned")
    native = case("jax-xla-chunked", "native", drift, config="query_chunk=256,key_chunk=512", source="tuned")
    out = tuning_columns(forced, native, answers.FORCED, 0.1)
    assert out["forced_config"] == "tuned block_q=256,block_k=256"
    assert out["native_config"] == "defaults query_chunk=256,key_chunk=512 (kept by tuning)"
    assert out["paper_at_defaults"] == answers.NATIVE and out["paper_at_defaults_ratio"] == pytest.approx(1.3)
    assert out["tuning"] == ("tuned jax-blockwise-flash: changed the paper answer, native at defaults, "
                             "forced tuned")
    assert verdict_display.tuning_short({**out, "paper": answers.FORCED}) == (
        "flipped: on paper native at defaults, forced tuned")
    same = tuning_columns(forced, native, answers.NATIVE, 0.1)
    assert same["tuning"] == "tuned jax-blockwise-flash: the same paper answer at defaults (native)"
    unsure = tuning_columns(forced, native, answers.CANT_TELL, 0.1)
    assert unsure["tuning"] == "tuned jax-blockwise-flash: on paper native at defaults, can't tell tuned"
    assert verdict_display.tuning_short({**unsure, "paper": answers.CANT_TELL}) == (
        "on paper native at defaults, can't tell tuned")
    assert verdict_display.tuning_short({**same, "paper": answers.NATIVE}) == (
        "on paper native, at defaults too")
    untuned = tuning_columns(case("a", "forced-flash", drift), case("b", "native", drift),
                             answers.FORCED, 0.1)
    assert untuned["tuning"] == "not tuned" and untuned["paper_at_defaults"] == "-"
    assert verdict_display.compact_config(out["forced_config"]) == "256x256"


def test_a_group_only_an_interpreter_runs_here_is_filed_as_not_tuned_with_the_reason():
    from attnbench.cli_tune import not_tuned_reason

    assert "only in an interpreter" in not_tuned_reason({"reason": None, "execution": "interpret"})
    assert not_tuned_reason({"reason": "FlexAttention does not support backward on CPU"}) == (
        "not tuned here: FlexAttention does not support backward on CPU")
    assert not_tuned_reason({"reason": None, "execution": "compiled"}) is None
