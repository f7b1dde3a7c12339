"""What the asv classes of ``benchmarks/compiled_for.py`` compile, and how they read the records.

``CompiledFor``: the toy workload over lengths; ``CompiledForModels``: the model presets at their
real lengths, with their masks. Sizes follow ``ATTNBENCH_SUITE`` like the measured suite
(docs/compiled-for.md); ``ATTNBENCH_COMPILE_TARGETS`` and ``ATTNBENCH_IMPLS`` narrow a run.

Outside the targets venv every case is n/a (``NotImplementedError`` with the install step), without
importing jax. Tracked figures are the compiler's decisions, deterministic for a commit and
compiler versions.
"""

from __future__ import annotations

import math
import os

import attention_impls
from attnbench.asv.sizes import impl_names as suite_impls
from attnbench.asv.sizes import suite_name
from attnbench.compiled_for import classify, run
from attnbench.compiled_for import targets as compile_targets
from attnbench.compiled_for.records import case_key
from attnbench.compiled_for.run import Case
from attnbench.compiled_for.targets import get_targets
from attnbench.core import presets
from attnbench.core.workload import Workload

VERSION = "1"  # the benchmarks' explicit asv version: cosmetic edits keep the history
TEMPLATE = Workload(batch=1, q_heads=8, head_dim=64, seq_q=4096, causal=True, mode="fwd", dtype="bfloat16")
SUITES = {
    "default": {"targets": ("tpu-v5e", "h200"), "seqs": (4096, 32768), "modes": ("fwd",),
                "dtypes": ("bfloat16",), "interpreted": False},
    "smoke": {"targets": ("tpu-v5e", "h200"), "seqs": (1024,), "modes": ("fwd",),
              "dtypes": ("bfloat16",), "interpreted": False},
    "full": {"targets": ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v5e-2x2", "h100-sxm", "h200"),
             "seqs": (1024, 4096, 16384, 32768, 65536, 131072), "modes": ("fwd", "fwd_bwd"),
             "dtypes": ("bfloat16",), "interpreted": True},
}
# CompiledForModels. Lengths per phase: prefill and training tokens per sequence, decode cache keys.
MODEL_LENGTHS = {"prefill": (8192, 32768), "training": (8192, 32768), "decode": (32768, 131072)}
MODEL_DTYPE = "bfloat16"
# ``impls``/``presets``/``cases`` None: every one. The default's subset is sized for make bench on a
# 2-core host: GQA (Llama) and window + softcap (Gemma), with the kernels quickest to compile that
# cover them (jax-blockwise-flash compiles like jax-xla-chunked, slower).
MODELS = {
    "default": {"targets": ("tpu-v5e", "h200"),
                "impls": ("jax-xla", "jax-xla-chunked", "jax-pallas-tpu-flash", "jax-pallas-tpu-splash",
                          "jax-cudnn", "jax-pallas-gpu-decode"),
                "presets": ("llama-3.1-8b", "gemma-2-9b"), "phases": ("prefill", "decode"),
                "cases": (("llama-3.1-8b", "prefill", 32768), ("llama-3.1-8b", "decode", 131072),
                          ("gemma-2-9b", "prefill", 8192)),
                "interpreted": False, "timeout": 3600},
    "smoke": {"targets": ("tpu-v5e", "h200"), "impls": ("jax-xla",),
              "presets": ("llama-3.1-8b", "gemma-2-9b", "vit-b-16"), "phases": ("prefill", "decode"),
              "cases": (("llama-3.1-8b", "decode", 32768),), "interpreted": False, "timeout": 3600},
    "full": {"targets": ("tpu-v5e", "tpu-v6e", "h200"), "impls": None, "presets": None,
             "phases": ("prefill", "training", "decode"), "cases": None, "interpreted": True,
             "timeout": 12 * 3600},
}
# The GPU suite (tools/device-run.sh) has no targets venv: smoke grids, every case n/a.
SUITES["gpu"], MODELS["gpu"] = SUITES["smoke"], MODELS["smoke"]
COMPILE_TIMEOUT_S = 900.0
# The status metric: lower is better, as asv assumes. unsupported cases are skipped (n/a) instead.
STATUS_CODES = {classify.OK: 0, classify.DOES_NOT_FIT: 1, classify.KERNEL_REFUSED: 2,
                classify.TIMEOUT: 3, classify.ERROR: 4}
TARGETS_ENV = "ATTNBENCH_COMPILE_TARGETS"


def settings() -> dict:
    name = suite_name()
    if name not in SUITES:
        raise ValueError(f"ATTNBENCH_SUITE must be one of {sorted(SUITES)}, got {name!r}")
    return SUITES[name]


def target_names() -> list[str]:
    chosen = os.environ.get(TARGETS_ENV)
    names = [n.strip() for n in chosen.split(",") if n.strip()] if chosen else list(settings()["targets"])
    return [t.name for t in get_targets(names)]  # unknown names fail loudly


def impl_names() -> list[str]:
    return [n for n in suite_impls() if attention_impls.get(n).framework == "jax"]


def workload(seq_len: int, mode: str, dtype: str) -> Workload:
    return TEMPLATE.replace(seq_q=seq_len, seq_k=seq_len, mode=mode, dtype=dtype)


def key(target: str, impl: str, seq_len: int, mode: str, dtype: str) -> str:
    return case_key(target, impl, workload(seq_len, mode, dtype))


def outside_suite(target, impl_name: str, grid: dict) -> str | None:
    """Why a case is left out of this suite size without compiling (interpreted kernels in default)."""
    support = attention_impls.get(impl_name).platform_support[target.platform]
    if support.status == "interpret-only" and not grid["interpreted"]:
        return (f"{impl_name} is interpret-only on {target.platform} ({support.note}); the "
                f"{suite_name()} suite compiles kernels on their own hardware and portable lowerings "
                "only (ATTNBENCH_SUITE=full compiles it too)")
    return None


def _compile(entries: list[tuple]) -> dict:
    """``{key: record}`` for ``(key, target, impl, workload, skip reason)``; skipped: ``{"skip": reason}``."""
    out, cases = {}, []
    for k, target, impl, work, skip in entries:
        if skip:
            out[k] = {"skip": skip}
        else:
            cases.append((k, Case(target, impl, work)))
    if cases:
        rows = run.run_cases([c for _, c in cases], timeout_s=COMPILE_TIMEOUT_S, progress=False)
        out.update({k: row for (k, _), row in zip(cases, rows, strict=True)})
    return out


def _left_out(target, impl: str, grid: dict) -> str | None:
    """Why no case of ``impl`` on ``target`` compiles here: no compiler, or the suite leaves it out."""
    return compile_targets.environment_problem(target.platform) or outside_suite(target, impl, grid)


def compile_grid(targets: list[str], impls: list[str], seqs: list[int], modes: list[str],
                 dtypes: list[str]) -> dict:
    """``{case key: record}``: each case compiled once, or a skip record. Imports jax only in the worker."""
    grid = settings()
    entries = []
    for target in get_targets(targets):
        for impl in impls:
            left_out = _left_out(target, impl, grid)
            entries += [(key(target.name, impl, seq, mode, dtype), target, impl, workload(seq, mode, dtype),
                         left_out) for mode in modes for dtype in dtypes for seq in seqs]
    return _compile(entries)


def _lookup(cache: dict, k: str, target: str, impl: str, what: str) -> dict:
    record = cache.get(k)
    if record is None:
        raise NotImplementedError(f"{target} {impl} {what}: not compiled in this run")
    if "skip" in record:
        raise NotImplementedError(record["skip"])
    if record.get("status") == classify.UNSUPPORTED:
        raise NotImplementedError(f"{impl} on {target}: {record.get('reason')}")
    return record


def record_for(cache: dict, target: str, impl: str, seq_len: int, mode: str, dtype: str) -> dict:
    """The case's record; ``NotImplementedError`` (asv: n/a) for a skipped or unsupported case."""
    return _lookup(cache, key(target, impl, seq_len, mode, dtype), target, impl,
                   f"{seq_len} {mode} {dtype}")


# ------------------------------------------------------------------------ CompiledForModels
def model_settings() -> dict:
    settings()  # an unknown size fails here, naming the valid ones
    return MODELS[suite_name()]


def model_target_names() -> list[str]:
    chosen = os.environ.get(TARGETS_ENV)
    names = ([n.strip() for n in chosen.split(",") if n.strip()] if chosen
             else list(model_settings()["targets"]))
    return [t.name for t in get_targets(names)]


def model_impl_names() -> list[str]:
    """The size's kernels; ``ATTNBENCH_IMPLS`` replaces them (its jax ones, the registry's order)."""
    chosen = model_settings()["impls"]
    every = impl_names()  # the jax kernels, narrowed by ATTNBENCH_IMPLS when it is set
    if chosen is None or os.environ.get("ATTNBENCH_IMPLS"):
        return every
    return [n for n in every if n in chosen]


def model_preset_names() -> list[str]:
    chosen = model_settings()["presets"]
    return list(presets.PRESETS) if chosen is None else [presets.get(n).name for n in chosen]


def model_phases() -> list[str]:
    return list(model_settings()["phases"])


def model_lengths() -> list[int]:
    """Every length of the size's phases, ascending (the ``length`` parameter)."""
    return sorted({n for phase in model_phases() for n in MODEL_LENGTHS[phase]})


def _unit(phase: str) -> tuple[str, str]:
    return ("cache", "keys") if phase == "decode" else (
        "prompt" if phase == "prefill" else "training sequence", "tokens")


def _listing(cases) -> str:
    return ", ".join(f"{p} {ph} {n}" for p, ph, n in cases)


def model_case(preset: str, phase: str, length: int) -> tuple[Workload | None, str | None]:
    """``(workload, None)`` for a case of the models grid, or ``(None, why it is n/a)``."""
    p = presets.get(preset)
    what, unit = _unit(phase)
    if phase not in p.phases:
        return None, f"{preset} has no {phase} phase ({p.notes or 'an encoder'}): it keeps no KV cache"
    if length not in MODEL_LENGTHS[phase]:
        return None, (f"{phase} compiles {what}s of {' and '.join(map(str, MODEL_LENGTHS[phase]))} {unit}; "
                      f"{length} is not one of them")
    if p.encoder_length and p.encoder_length < length:
        return None, (f"{preset} is an encoder of {p.encoder_length} tokens, its own fixed length: it "
                      f"runs no {length}-{unit[:-1]} {what}")
    if p.context < length:
        return None, (f"{preset}'s context is {p.context} tokens (the model's maximum positions), "
                      f"shorter than a {length}-{unit[:-1]} {what}")
    chosen = model_settings()["cases"]
    if chosen is not None and (preset, phase, length) not in chosen:
        return None, (f"left out of the {suite_name()} suite size, which compiles {_listing(chosen)} "
                      "(ATTNBENCH_SUITE=full compiles every preset at every length)")
    extent = {"kv_len": length} if phase == "decode" else {"seq": length}
    return presets.workload(preset, phase, size="real", dtype=MODEL_DTYPE, **extent), None


def model_key(target: str, impl: str, preset: str, phase: str, length: int) -> str:
    return f"models|{target}|{impl}|{preset}|{phase}|{length}"


def compile_models_grid(targets: list[str], impls: list[str], workloads: list[str], phases: list[str],
                        lengths: list[int]) -> dict:
    """``{model key: record}`` over target x impl x preset x phase x length, as ``compile_grid``."""
    grid = model_settings()
    entries = []
    for target in get_targets(targets):
        for impl in impls:
            left_out = _left_out(target, impl, grid)
            for preset in workloads:
                for phase in phases:
                    for length in lengths:
                        work, reason = model_case(preset, phase, length)
                        entries.append((model_key(target.name, impl, preset, phase, length), target, impl,
                                        work, reason or left_out))
    return _compile(entries)


def model_record_for(cache: dict, target: str, impl: str, preset: str, phase: str, length: int) -> dict:
    """A models case's record; ``NotImplementedError`` (asv: n/a) with the reason where it has none."""
    return _lookup(cache, model_key(target, impl, preset, phase, length), target, impl,
                   f"{preset} {phase} {length}")


def number(record: dict, column: str) -> float:
    """A column as a float for asv; NaN (n/a) where the compile gave none."""
    value = record.get(column)
    if value is None or isinstance(value, str):
        return math.nan
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    value = float(value)
    return value if math.isfinite(value) else math.nan


def status_code(record: dict) -> float:
    return float(STATUS_CODES.get(record.get("status"), STATUS_CODES[classify.ERROR]))


def does_not_fit(record: dict) -> float:
    """1 when the program does not fit the target's HBM, 0 when it fits (lower is better, for asv);
    NaN where unknowable."""
    fits = record.get("fits")
    return math.nan if fits is None else (0.0 if fits else 1.0)
