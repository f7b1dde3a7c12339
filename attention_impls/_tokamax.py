"""What the six Tokamax kernels share: one call, ``tokamax.dot_product_attention(implementation=...)``.

Tokamax (openxla/tokamax, Apache-2.0, pinned at 0.0.12: its newest release for Python 3.11) gathers
the kernels a team chooses between: XLA, XLA chunked, Mosaic TPU (splash-based), Triton, Mosaic GPU
and cuDNN. Each ``jax-tokamax-<implementation>`` file declares one of them; this module holds their
call and the rules their public API has in common:

- Its causal mask is top-left aligned (``base.Mask.as_array``: ``q_index >= k_index``, and
  ``local_window_size`` counts from the same 0), so ``Sq != Sk`` with causal is refused, never emulated.
- Segment ids go in as the API's dense boolean ``mask`` ``[B, 1, Sq, Sk]``: the only way the public
  call takes them (Tokamax's ``q_indices`` / ``k_indices`` are not in it).
- A window is ``local_window_size=(W - 1, 0)``, which Tokamax turns into per-row ``k_start`` / ``k_end``.
- Which config a tuned kernel runs at is Tokamax's own choice: its autotuning cache for the device kind
  and the exact arguments when it has them, else its heuristics (Mosaic TPU: 128x128 tiles).
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl, top_left_causal_reason

# Imported where used: jax, tokamax (each venv holds only some frameworks, and the asv process none).

PACKAGE = "tokamax"
CALL = "tokamax:dot_product_attention"
CALL_KEYWORDS = ("mask", "scale", "is_causal", "local_window_size", "logits_soft_cap", "implementation")
SOURCE = "openxla/tokamax 0.0.12 (tokamax/_src/ops/attention/)"


def absl_flags_parsed() -> None:
    """Mark absl's flags parsed, at their defaults, if nothing has parsed them yet. Tokamax reads its
    options through absl flags (``tokamax/_src/config.py``) and, the first time, parses ``sys.argv`` as
    absl flags: in a process whose arguments are not absl's (pytest's ``-q``, asv's, this CLI's) that
    raises ``UnrecognizedFlagError: Unknown command line flag``."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class TokamaxAttention(AttentionImpl):
    """One of Tokamax's attention implementations through its public call."""

    framework = "jax"
    library = PACKAGE
    requires_modules = (PACKAGE,)
    public_calls = {CALL: CALL_KEYWORDS}
    call_name = "tokamax.dot_product_attention"
    gqa = "native"  # k and v keep their own heads in the call: each op groups the query heads itself
    # tokamax's own name for the implementation (``tokamax.dot_product_attention(implementation=)``)
    implementation: str = ""
    # "mosaic" picks Mosaic GPU or Mosaic TPU by the default device's kind, and each op checks the
    # device it is traced for (``supported_on``): traced for a compile target, the target's device
    # must be jax's default one (compiled_for/compile.py).
    lowers_on_target_device = True

    def shape_reason(self, workload, platform):
        return top_left_causal_reason(
            workload, "tokamax Mask(is_causal=True): q_index >= k_index",
            "Tokamax's public call takes no offset; a dense [Sq, Sk] mask would not be its causal kernel")

    def implementation_arg(self):
        """What the call's ``implementation=`` gets: tokamax's name (an op instance where the project
        adapts one, e.g. to run it in an interpreter)."""
        return self.implementation

    def attention(self, q, k, v, *, causal, scale, window=None, softcap=None, q_segment_ids=None,
                  kv_segment_ids=None):
        import tokamax

        absl_flags_parsed()
        options = {}
        if window is not None:
            options["local_window_size"] = (window - 1, 0)  # W keys: itself and W - 1 before
        if softcap is not None:
            options["logits_soft_cap"] = softcap  # tanh-capped scaled scores, as attnbench.core.masks
        if q_segment_ids is not None:
            options["mask"] = (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])[:, None]
        return tokamax.dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                             implementation=self.implementation_arg(), **options)
