"""The workload catalogue: real models' attention, by name, with where each number comes from.

``workload(preset, phase, ...)`` makes a preset's ``Workload`` for ``prefill``, ``training`` or
``decode``. ``SIZES``: ``real`` runs the model's own lengths; ``default`` fits a 2-core CPU, heads kept
and masks in proportion (a window covers the same fraction of the sequence, and the workload's
``window_scaled_from`` names the model's own). A length the caller asks for keeps the model's window.
Every value was checked against the model's published config (``source``; docs/workloads.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.core.workload import PHASE_MODES, PHASES, Workload

# The layers of a model that alternates them (Gemma-2): local ones use the window, global ones do not.
LAYERS = ("local", "global")


@dataclass(frozen=True)
class Preset:
    name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    source: str
    causal: bool = True
    window: int | None = None
    window_layers: str = ""  # which layers are local (windowed), when the others are global
    softcap: float | None = None
    context: int = 131072  # the model's maximum positions (max_position_embeddings)
    encoder_length: int | None = None  # an encoder's own sequence length (ViT's 197 tokens)
    notes: str = ""

    @property
    def phases(self) -> tuple[str, ...]:
        return PHASES if self.causal else ("prefill", "training")  # an encoder has no KV cache

    @property
    def gqa(self) -> str:
        if self.kv_heads == self.q_heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else f"GQA {self.q_heads // self.kv_heads}:1"

    @property
    def mask(self) -> str:
        parts = ["causal" if self.causal else "bidirectional"]
        if self.window:
            parts.append(f"window {self.window}" + (f" ({self.window_layers})" if self.window_layers else ""))
        if self.softcap:
            parts.append(f"softcap {self.softcap:g}")
        return ", ".join(parts)


HF = "https://huggingface.co/{}/blob/main/config.json"
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("llama-3.1-8b", 32, 8, 128, HF.format("meta-llama/Llama-3.1-8B") +
           ": num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim 128), "
           "max_position_embeddings 131072", context=131072),
    Preset("llama-3.1-70b", 64, 8, 128, HF.format("meta-llama/Llama-3.1-70B") +
           ": num_attention_heads 64, num_key_value_heads 8, hidden_size 8192 (head_dim 128), "
           "max_position_embeddings 131072", context=131072),
    Preset("mistral-7b", 32, 8, 128, HF.format("mistralai/Mistral-7B-v0.1") +
           ": num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim 128), "
           "sliding_window 4096, max_position_embeddings 32768; Jiang et al. 2023 (arXiv:2310.06825) "
           "section 2: window W = 4096 on every layer", window=4096, context=32768,
           notes="v0.1 (v0.2 and later set sliding_window null)"),
    Preset("gemma-2-9b", 16, 8, 256, HF.format("google/gemma-2-9b") +
           ": num_attention_heads 16, num_key_value_heads 8, head_dim 256, sliding_window 4096, "
           "attn_logit_softcapping 50.0, query_pre_attn_scalar 256 (scale 1/16 = 1/sqrt(head_dim)), "
           "max_position_embeddings 8192, 42 layers; transformers' Gemma2 layers are sliding when "
           "layer_idx is even (is_sliding = not bool(layer_idx % 2)); Gemma Team 2024 "
           "(arXiv:2408.00118) section 2",
           window=4096, window_layers="local layers 0, 2, 4, ...; odd layers global", softcap=50.0,
           context=8192),
    Preset("qwen2.5-7b", 28, 4, 128, HF.format("Qwen/Qwen2.5-7B") +
           ": num_attention_heads 28, num_key_value_heads 4, hidden_size 3584 (head_dim 128), "
           "max_position_embeddings 131072, use_sliding_window false", context=131072),
    Preset("vit-b-16", 12, 12, 64, HF.format("google/vit-base-patch16-224") +
           ": num_attention_heads 12, hidden_size 768 (head_dim 64), image 224 / patch 16 = 196 "
           "patches + [CLS] = 197 tokens; Dosovitskiy et al. 2021 (arXiv:2010.11929) table 1",
           causal=False, context=197, encoder_length=197,
           notes="bidirectional encoder: no decode phase"),
    Preset("bert-base", 12, 12, 64, HF.format("google-bert/bert-base-uncased") +
           ": num_attention_heads 12, hidden_size 768 (head_dim 64), max_position_embeddings 512",
           causal=False, context=512, encoder_length=512,
           notes="bidirectional encoder over its whole padded 512-token sequence: no decode phase"),
)}

# Per size: each phase's length and the decode batch (module doc).
SIZES = {
    "real": {"prefill": 8192, "training": 8192, "decode": 32768, "batch": 1, "decode_batch": 8},
    "default": {"prefill": 512, "training": 256, "decode": 1024, "batch": 1, "decode_batch": 4},
    "smoke": {"prefill": 128, "training": 128, "decode": 256, "batch": 1, "decode_batch": 2},  # tests
}


def get(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown workload preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]


def real_length(preset: Preset, phase: str) -> int:
    """The length (tokens, or cache keys for decode) this preset runs ``phase`` at for real."""
    if preset.encoder_length:
        return preset.encoder_length
    return min(SIZES["real"][phase], preset.context)


def workload(name: str, phase: str = "prefill", *, size: str = "real", seq: int | None = None,
             kv_len: int | None = None, batch: int | None = None, window: int | None = None,
             softcap: float | None = None, documents: int | None = None, layer: str | None = None,
             dtype: str = "float32") -> Workload:
    """The ``Workload`` of preset ``name`` in ``phase`` at ``size``; the options override it.

    ``seq``: tokens per sequence, or decode's new query tokens (1 by default); ``kv_len``: decode's
    cache; neither may pass the model's context. An unset window is the model's at any length asked
    for; only a size's own shorter length scales it down, and ``window_scaled_from`` says so.
    ``layer``: ``local`` (the default) or ``global`` layers of a model that alternates them
    (Gemma-2). Documents are packed only when ``documents`` asks. Bad values raise ``ValueError``.
    """
    preset = get(name)
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
    if phase not in preset.phases:
        raise ValueError(f"{name} has no {phase} phase ({preset.notes or 'encoder'}); "
                         f"valid: {', '.join(preset.phases)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid: {', '.join(SIZES)}")
    if layer is not None and layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; valid: {', '.join(LAYERS)}")
    if layer is not None and not preset.window_layers:
        raise ValueError(f"{name} does not alternate local and global layers: --layer applies to "
                         f"{', '.join(p.name for p in PRESETS.values() if p.window_layers)}")
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap must be a positive number, got {softcap}")
    real = real_length(preset, phase)
    sized = real if preset.encoder_length else min(SIZES[size][phase], real)
    decode = phase == "decode"
    asked = kv_len if decode else seq  # the length the caller chose (None: the size's)
    if asked is not None and asked > preset.context:
        raise ValueError(f"{name}'s context is {preset.context} tokens; {'--kv-len' if decode else '--seq'} "
                         f"{asked} is longer")
    if decode:
        keys = kv_len if kv_len is not None else sized
        queries = seq if seq is not None else 1
        if queries > keys:
            raise ValueError(f"decode runs seq={queries} new tokens against a cache of kv_len={keys}: "
                             "seq must not exceed kv_len")
        length = keys
    else:
        if kv_len is not None:
            raise ValueError(f"--kv-len is decode's cache length; {phase} runs seq x seq (use --seq)")
        length = queries = keys = seq if seq is not None else sized
    scaled_from = None
    if window is None and preset.window and layer != "global":
        window = preset.window
        if asked is None and length < real:  # a size's shorter length: the window in proportion
            window, scaled_from = max(1, preset.window * length // real), preset.window
    if window is not None and not preset.causal:
        raise ValueError(f"a sliding window needs a causal mask; {name} is bidirectional")
    if documents is not None and decode:
        raise ValueError("documents pack a prefill or training sequence; decode's cache is ragged instead")
    batch = batch if batch is not None else SIZES[size]["decode_batch" if decode else "batch"]
    return Workload(batch=batch, q_heads=preset.q_heads, kv_heads=preset.kv_heads, seq_q=queries,
                    seq_k=keys, head_dim=preset.head_dim, dtype=dtype, causal=preset.causal,
                    mode=PHASE_MODES[phase], window=window,
                    softcap=softcap if softcap is not None else preset.softcap,
                    documents=documents, ragged=decode and batch > 1, name=name,
                    window_scaled_from=scaled_from)


def table() -> list[dict]:
    """One row per preset: what ``python -m attnbench workloads`` prints."""
    return [{"name": p.name, "heads": p.q_heads, "kv_heads": p.kv_heads, "head_dim": p.head_dim,
             "gqa": p.gqa, "mask": p.mask, "phases": "/".join(p.phases),
             "lengths": ", ".join(f"{ph} {real_length(p, ph)}" for ph in p.phases) + f"; context {p.context}",
             "source": p.source}
            for p in PRESETS.values()]
