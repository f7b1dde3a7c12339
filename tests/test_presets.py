"""The workload catalogue: each preset's published values, the workloads it makes, the CLI over it."""

from __future__ import annotations

import pytest

from attnbench.cli import build_parser, main, run_workloads
from attnbench.core import presets

# The published values the issue names (and the config each preset cites): any edit is a test edit.
PUBLISHED = {
    "llama-3.1-8b": (32, 8, 128, None, None),
    "llama-3.1-70b": (64, 8, 128, None, None),
    "mistral-7b": (32, 8, 128, 4096, None),
    "gemma-2-9b": (16, 8, 256, 4096, 50.0),
    "qwen2.5-7b": (28, 4, 128, None, None),
    "vit-b-16": (12, 12, 64, None, None),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_preset_holds_the_published_config(name):
    p = presets.get(name)
    assert (p.q_heads, p.kv_heads, p.head_dim, p.window, p.softcap) == PUBLISHED[name]
    assert p.source.startswith("https://huggingface.co/") and "config.json" in p.source
    for value in (p.q_heads, p.kv_heads, p.head_dim):
        assert str(value) in p.source  # the source line states each number it backs


def test_real_workloads_run_the_models_lengths():
    w = presets.workload("llama-3.1-70b", "prefill")
    assert (w.q_heads, w.kv_heads, w.head_dim, w.seq_q, w.causal, w.mode) == (64, 8, 128, 8192, True, "fwd")
    d = presets.workload("llama-3.1-8b", "decode")
    assert (d.seq_q, d.seq_k, d.batch, d.ragged, d.phase) == (1, 32768, 8, True, "decode")
    t = presets.workload("mistral-7b", "training")
    assert (t.mode, t.documents, t.window) == ("fwd_bwd", 4, 4096)
    g = presets.workload("gemma-2-9b", "prefill")
    assert (g.window, g.softcap, g.seq_q) == (4096, 50.0, 8192)
    assert presets.workload("gemma-2-9b", "prefill", layer="global").window is None
    v = presets.workload("vit-b-16", "training")
    assert (v.seq_q, v.causal, v.documents) == (197, False, None)
    assert presets.workload("bert-base", "prefill").documents == 4


def test_the_default_size_scales_lengths_and_keeps_masks_in_proportion():
    real = presets.workload("mistral-7b", "prefill")
    small = presets.workload("mistral-7b", "prefill", size="default")
    assert small.seq_q == 512 and small.window == 512 * 4096 // 8192
    assert small.window / small.seq_q == real.window / real.seq_q
    assert (small.q_heads, small.kv_heads, small.head_dim) == (real.q_heads, real.kv_heads, real.head_dim)
    decode = presets.workload("mistral-7b", "decode", size="default")
    assert (decode.seq_k, decode.window) == (1024, 1024 * 4096 // 32768)
    assert presets.workload("vit-b-16", "prefill", size="default").seq_q == 197  # an encoder's own length


@pytest.mark.parametrize("call, message", [
    (lambda: presets.workload("llama-9"), "unknown workload preset 'llama-9'; valid: llama-3.1-8b"),
    (lambda: presets.workload("vit-b-16", "decode"), "vit-b-16 has no decode phase"),
    (lambda: presets.workload("llama-3.1-8b", "serve"), "unknown phase 'serve'; valid: prefill"),
    (lambda: presets.workload("llama-3.1-8b", "decode", seq=8, kv_len=4), "seq must not exceed kv_len"),
    (lambda: presets.workload("llama-3.1-8b", softcap=-1.0), "softcap must be a positive"),
    (lambda: presets.workload("vit-b-16", window=16), "needs a causal mask; vit-b-16 is bidirectional"),
    (lambda: presets.workload("llama-3.1-8b", layer="global"), "has no global layers"),
    (lambda: presets.workload("llama-3.1-8b", "decode", documents=2), "decode's cache is ragged"),
])
def test_bad_preset_options_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _run_args(*argv):
    return build_parser().parse_args(["run", *argv])


def test_cli_workload_options_override_the_preset():
    [w] = run_workloads(_run_args("--workload", "gemma-2-9b", "--phase", "decode", "--kv-len", "2048",
                                  "--batch", "2", "--window", "64", "--softcap", "30"))
    assert (w.seq_q, w.seq_k, w.batch, w.window, w.softcap, w.name) == (1, 2048, 2, 64, 30.0, "gemma-2-9b")
    sweep = run_workloads(_run_args("--workload", "llama-3.1-8b", "--seq", "256", "512", "--documents", "2"))
    assert [(w.seq_q, w.documents, w.phase) for w in sweep] == [(256, 2, "prefill"), (512, 2, "prefill")]
    [custom] = run_workloads(_run_args("--seq", "128", "--window", "32", "--phase", "training"))
    assert (custom.name, custom.window, custom.mode) == ("custom", 32, "fwd_bwd")


@pytest.mark.parametrize("argv, message", [
    (["--workload", "no-such-model"], "unknown workload preset 'no-such-model'; valid: llama-3.1-8b"),
    (["--window", "64", "--no-causal"], "--window needs a causal mask"),
    (["--workload", "llama-3.1-8b", "--phase", "decode", "--seq", "64", "--kv-len", "32"],
     "seq must not exceed kv_len"),
    (["--phase", "decode", "--seq", "64", "--kv-len", "32"], "seq must not exceed kv_len"),
    (["--softcap", "0"], "--softcap must be a positive number"),
    (["--softcap", "-2"], "--softcap must be a positive number"),
    (["--phase", "decode"], "--phase decode needs --kv-len"),
    (["--workload", "llama-3.1-8b", "--heads", "4"], "fixes the heads"),
    (["--workload", "llama-3.1-8b", "--phase", "decode", "--regime", "dynamic"], "decode runs the static"),
])
def test_cli_refuses_bad_workloads_naming_what_is_wrong(argv, message, capsys):
    assert main(["run", "--impl", "reference-float64", "--no-isolate", "--quiet", "--out", "/nonexistent",
                 *argv]) == 2
    assert message in capsys.readouterr().err


def test_workloads_command_lists_every_preset(capsys):
    assert main(["workloads", "--sources"]) == 0
    out = capsys.readouterr().out
    for name, (heads, kv, dim, window, _) in PUBLISHED.items():
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert f" {heads} " in line and f" {kv} " in line and f" {dim} " in line and "huggingface.co" in line
        assert (f"window {window}" in line) == bool(window)
