"""The workload catalogue: each preset's published values, the workloads it makes, the CLI over it."""

from __future__ import annotations

import pytest

from attnbench.cli import build_parser, main
from attnbench.cli_run import run_workloads
from attnbench.core import presets

# The published values the issue names (and the config each preset cites): any edit is a test edit.
PUBLISHED = {
    "llama-3.1-8b": (32, 8, 128, None, None),
    "llama-3.1-70b": (64, 8, 128, None, None),
    "mistral-7b": (32, 8, 128, 4096, None),
    "gemma-2-9b": (16, 8, 256, 4096, 50.0),
    "qwen2.5-7b": (28, 4, 128, None, None),
    "vit-b-16": (12, 12, 64, None, None),
    "bert-base": (12, 12, 64, None, None),
}
# max_position_embeddings of each config (ViT has none: its 197 tokens are its whole input).
CONTEXT = {"llama-3.1-8b": 131072, "llama-3.1-70b": 131072, "mistral-7b": 32768, "gemma-2-9b": 8192,
           "qwen2.5-7b": 131072, "vit-b-16": 197, "bert-base": 512}


@pytest.mark.parametrize("name", PUBLISHED)
def test_preset_holds_the_published_config(name):
    p = presets.get(name)
    assert (p.q_heads, p.kv_heads, p.head_dim, p.window, p.softcap) == PUBLISHED[name]
    assert p.source.startswith("https://huggingface.co/") and "config.json" in p.source
    for value in (p.q_heads, p.kv_heads, p.head_dim):
        assert str(value) in p.source  # the source line states each number it backs
    assert p.context == CONTEXT[name]
    if name != "vit-b-16":
        assert f"max_position_embeddings {CONTEXT[name]}" in p.source


def test_real_workloads_run_the_models_lengths():
    w = presets.workload("llama-3.1-70b", "prefill")
    assert (w.q_heads, w.kv_heads, w.head_dim, w.seq_q, w.causal, w.mode) == (64, 8, 128, 8192, True, "fwd")
    d = presets.workload("llama-3.1-8b", "decode")
    assert (d.seq_q, d.seq_k, d.batch, d.ragged, d.phase) == (1, 32768, 8, True, "decode")
    t = presets.workload("mistral-7b", "training")
    assert (t.mode, t.documents, t.window) == ("fwd_bwd", None, 4096)
    g = presets.workload("gemma-2-9b", "prefill")
    assert (g.window, g.softcap, g.seq_q) == (4096, 50.0, 8192)
    assert presets.workload("gemma-2-9b", "prefill", layer="global").window is None
    v = presets.workload("vit-b-16", "training")
    assert (v.seq_q, v.causal, v.documents) == (197, False, None)
    assert presets.workload("bert-base", "prefill").documents is None


def test_the_default_size_scales_lengths_and_keeps_masks_in_proportion():
    real = presets.workload("mistral-7b", "prefill")
    small = presets.workload("mistral-7b", "prefill", size="default")
    assert small.seq_q == 512 and small.window == 512 * 4096 // 8192
    assert small.window / small.seq_q == real.window / real.seq_q
    assert (small.q_heads, small.kv_heads, small.head_dim) == (real.q_heads, real.kv_heads, real.head_dim)
    assert (real.window_scaled_from, small.window_scaled_from) == (None, 4096)
    decode = presets.workload("mistral-7b", "decode", size="default")
    assert (decode.seq_k, decode.window, decode.window_scaled_from) == (1024, 1024 * 4096 // 32768, 4096)
    assert presets.workload("vit-b-16", "prefill", size="default").seq_q == 197  # an encoder's own length


@pytest.mark.parametrize("call, message", [
    (lambda: presets.workload("llama-9"), "unknown workload preset 'llama-9'; valid: llama-3.1-8b"),
    (lambda: presets.workload("vit-b-16", "decode"), "vit-b-16 has no decode phase"),
    (lambda: presets.workload("llama-3.1-8b", "serve"), "unknown phase 'serve'; valid: prefill"),
    (lambda: presets.workload("llama-3.1-8b", "decode", seq=8, kv_len=4), "seq must not exceed kv_len"),
    (lambda: presets.workload("llama-3.1-8b", softcap=-1.0), "softcap must be a positive"),
    (lambda: presets.workload("vit-b-16", window=16), "needs a causal mask; vit-b-16 is bidirectional"),
    (lambda: presets.workload("llama-3.1-8b", layer="global"),
     "llama-3.1-8b does not alternate local and global layers: --layer applies to gemma-2-9b"),
    (lambda: presets.workload("mistral-7b", layer="local"), "mistral-7b does not alternate"),
    (lambda: presets.workload("gemma-2-9b", layer="windowed"),
     "unknown layer 'windowed'; valid: local, global"),
    (lambda: presets.workload("gemma-2-9b", seq=16384),
     "gemma-2-9b's context is 8192 tokens; --seq 16384 is longer"),
    (lambda: presets.workload("gemma-2-9b", "decode", kv_len=8193),
     "gemma-2-9b's context is 8192 tokens; --kv-len 8193 is longer"),
    (lambda: presets.workload("bert-base", seq=1024), "bert-base's context is 512 tokens; --seq 1024"),
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
    (["--workload", "gemma-2-9b", "--seq", "16384"],
     "gemma-2-9b's context is 8192 tokens; --seq 16384 is longer"),
    (["--workload", "llama-3.1-8b", "--layer", "global"], "llama-3.1-8b does not alternate local and global"),
    (["--layer", "global"], "--layer and --size pick a preset's layer and lengths: they need --workload"),
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


# -- the model's window at any length, the training window binding, the layers, the encoder ------
def test_a_length_asked_for_keeps_the_models_window_at_every_length():
    sweep = run_workloads(_run_args("--workload", "mistral-7b", "--seq", "1024", "2048", "4096", "8192"))
    assert [(w.seq_q, w.window, w.window_scaled_from) for w in sweep] == \
        [(1024, 4096, None), (2048, 4096, None), (4096, 4096, None), (8192, 4096, None)]
    # Up to 4096 tokens no query reaches back 4096 keys: every causal pair is kept, S(S+1)/2.
    assert [w.pairs for w in sweep[:3]] == [1024 * 1025 // 2, 2048 * 2049 // 2, 4096 * 4097 // 2]
    # At 8192 the window binds: rows 0..4095 keep i + 1 keys, rows 4096..8191 keep 4096 each.
    assert sweep[3].pairs == 4096 * 4097 // 2 + 4096 * 4096 == 25_167_872
    # The regimes' path (at_length) and the CLI's agree: the same window at the same length.
    assert sweep[0].at_length(4096) == sweep[2]
    # A size's own length scales the window; a length asked for at that size does not.
    assert presets.workload("mistral-7b", size="default", seq=1024).window == 4096
    decode = presets.workload("mistral-7b", "decode", size="default", kv_len=2048)
    assert (decode.window, decode.window_scaled_from) == (4096, None)


def test_the_record_names_the_models_window_where_a_size_scaled_it():
    from attnbench.core.records import new_record

    scaled = new_record(presets.workload("gemma-2-9b", "prefill", size="default"))
    # 512 tokens of the real 8192: the 4096-key window in proportion, 512 * 4096 // 8192 = 256.
    assert (scaled["window"], scaled["window_scaled_from"], scaled["mask"]) == \
        (256, 4096, "causal+window(256)+softcap(50)")
    real = new_record(presets.workload("gemma-2-9b", "prefill"))
    assert (real["window"], real["window_scaled_from"]) == (4096, None)
    unwindowed = new_record(presets.workload("llama-3.1-8b", size="default"))
    assert unwindowed["window_scaled_from"] is None


def test_training_lets_the_window_bind():
    # One whole 8192-token sequence, no documents: Llama keeps the causal triangle, 8192 * 8193 / 2
    # pairs per head; Mistral's and Gemma's local layers keep 4096 * 4097 / 2 + 4096 * 4096.
    llama = presets.workload("llama-3.1-8b", "training")
    mistral = presets.workload("mistral-7b", "training")
    gemma_local = presets.workload("gemma-2-9b", "training")
    assert (llama.seq_q, llama.documents, llama.mode) == (8192, None, "fwd_bwd")
    assert llama.pairs == 33_558_528
    assert mistral.pairs == gemma_local.pairs == 25_167_872
    assert mistral.mask_density == 25_167_872 / 8192**2
    # FLOPs follow: 4 * D * Hq * pairs, 3.5x for fwd + bwd.
    assert mistral.flops == 3.5 * 4 * 128 * 32 * 25_167_872
    # Gemma's global layers are Llama's triangle (with the soft cap, which changes no pair).
    gemma_global = presets.workload("gemma-2-9b", "training", layer="global")
    assert gemma_global.pairs == 33_558_528 and gemma_global.softcap == 50.0
    # At the default size (256 tokens, window 4096 * 256 // 8192 = 128) it binds too:
    # rows 0..127 keep i + 1 keys, rows 128..255 keep 128: 8256 + 16384 = 24640 of 32896 causal pairs.
    small = presets.workload("mistral-7b", "training", size="default")
    assert (small.window, small.pairs) == (128, 128 * 129 // 2 + 128 * 128)
    assert small.pairs == 24_640 < 256 * 257 // 2 == 32_896
    # Documents come when asked.
    assert presets.workload("llama-3.1-8b", "training", documents=4).documents == 4


def test_gemma_layers_local_and_global():
    local = presets.workload("gemma-2-9b", "prefill", layer="local")
    assert local == presets.workload("gemma-2-9b", "prefill")  # local is the default
    glob = presets.workload("gemma-2-9b", "prefill", layer="global", size="default")
    assert (glob.window, glob.window_scaled_from, glob.softcap, glob.seq_q) == (None, None, 50.0, 512)
    assert glob.mask == "causal+softcap(50)" and glob.pairs == 512 * 513 // 2
    [cli] = run_workloads(_run_args("--workload", "gemma-2-9b", "--layer", "global", "--seq", "1024"))
    assert (cli.window, cli.softcap, cli.seq_q) == (None, 50.0, 1024)
    [cli] = run_workloads(_run_args("--workload", "gemma-2-9b", "--layer", "local", "--seq", "1024"))
    assert cli.window == 4096


def test_bert_attends_over_its_whole_sequence():
    for phase in ("prefill", "training"):
        w = presets.workload("bert-base", phase)
        assert (w.seq_q, w.causal, w.documents, w.segmented, w.mask) == (512, False, None, False, "none")
        assert w.mask_density == 1.0 and w.pairs == 512 * 512
        assert w.mask_features == ()  # so no kernel is refused for segment ids it does not take
    assert presets.workload("bert-base", documents=4).documents == 4  # when asked


def test_the_catalogue_lists_each_context(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    gemma = next(line for line in out.splitlines() if line.startswith("gemma-2-9b "))
    assert "context 8192" in gemma and "softcap 50" in gemma
