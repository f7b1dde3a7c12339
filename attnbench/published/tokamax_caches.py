"""Tokamax's autotuning caches read as rows: device timings Tokamax publishes for its attention ops.

Tokamax (openxla/tokamax, Apache-2.0) ships ``tokamax/data/autotuning/<device_kind>/<op>.json``: for
each argument spec (a JSON key: shapes such as ``bf16[32,4096,32,128]`` in ``[*batch, seq, heads,
head_dim]`` layout, the mask, ...) and each config it tried (a JSON key, ``{}`` for an op without
knobs), the compile and lower times and the device-timed evaluations in milliseconds. Two sources:
the installed wheel's caches, and the repository's at one commit, vendored gzip-compressed in
``data/`` (its README says which files). A key without a result (``{}``) and an empty file give no
row and are counted; anything malformed is a ``PublishedError``, one line naming the file and the
entry. FLOPs follow the project's convention (``attnbench.core.workload``). Neither tokamax nor jax
is imported: the wheel is found by its spec, its version by its metadata.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnbench.core.workload import DTYPE_BYTES, Workload

# Imported where used: pandas (the torch_xla venv has none, and the CLI imports this module there).

if TYPE_CHECKING:
    import pandas as pd


class PublishedError(ValueError):
    """A published source that does not read as it should: one line naming the file, the entry and what is
    wrong (the CLI prints it and exits 2)."""


CACHE_DIR = "tokamax/data/autotuning"  # the caches' folder, in the package and in the repository
REPO_COMMIT = "783ea95704a581ea5b09c80d9d058c819cd8bf03"  # 2026-08-21
REPO_URL = f"https://github.com/openxla/tokamax/blob/{REPO_COMMIT}/"
VENDORED_DIR = Path(__file__).resolve().parent / "data" / "tokamax-783ea95"
VENDORED_SHOWN = "attnbench/published/data/tokamax-783ea95"  # how an error names a vendored file
VJP = "_vjp"
ENTRY_CHARS = 80  # how much of a key an error quotes

COLUMNS = (
    "evidence", "source", "source_file", "source_url", "device_kind", "device", "hardware_profile",
    "target", "op", "kernel", "implementation", "pass", "batch", "q_heads", "kv_heads", "seq_q", "seq_k",
    "head_dim", "head_dim_v", "dtype", "causal", "mask", "logits_soft_cap", "precision", "config",
    "n_evaluations", "median_ms", "min_ms", "max_ms", "spread", "compile_ms", "lower_ms",
    "peak_memory_mb", "flops", "tflops_per_s", "note",
)
"""A row's fields, in order (``table.COLUMNS`` is this)."""


@dataclass(frozen=True)
class Device:
    """A device kind's name in words, and the project's hardware profile and compile target for it ("" for
    none)."""

    name: str
    hardware_profile: str = ""
    target: str = ""


# jax's device.device_kind, lower-cased, spaces as underscores. tpu7x: hardware_profiles.toml has no
# TPU7x profile and targets.toml no target.
DEVICES = {
    "tpu7x": Device("TPU7x (Ironwood)"),
    "tpu_v5": Device("TPU v5p", "tpu-v5p", "tpu-v5p"),
    "tpu_v6_lite": Device("TPU v6e", "tpu-v6e", "tpu-v6e"),
    "tpu_v5_lite": Device("TPU v5e", "tpu-v5e", "tpu-v5e"),
    "nvidia_h100_80gb_hbm3": Device("NVIDIA H100 80GB HBM3", "h100-sxm", "h100-sxm"),
}


@dataclass(frozen=True)
class Op:
    """An attention op's cache: the project's kernel that calls it, tokamax's ``implementation=`` name for
    it, and what every row of it should say."""

    kernel: str
    implementation: str
    note: str = ""


JAX_NN_NOTE = ("tokamax's JaxNnDotProductAttention, which implementation='cudnn' builds; the cache does not "
               "record which jax.nn implementation ran")
# The op's class name snake-cased: the file's name, each with its _vjp twin (the backward pass).
OPS = {
    "dot_product_attention": Op("jax-tokamax-xla", "xla"),
    "xla_chunked_dot_product_attention": Op("jax-tokamax-xla-chunked", "xla_chunked"),
    "pallas_mosaic_tpu_flash_attention": Op("jax-tokamax-mosaic-tpu", "mosaic"),
    "pallas_triton_flash_attention": Op("jax-tokamax-triton", "triton"),
    "pallas_mosaic_gpu_flash_attention": Op("jax-tokamax-mosaic-gpu", "mosaic"),
    "jax_nn_dot_product_attention": Op("jax-tokamax-cudnn", "cudnn", JAX_NN_NOTE),
}
DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}  # others (f8e4m3fn...) kept as given
SHAPE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[(\d+(?:,\s*\d+)*)?\]")
BOUNDS = ("q_start", "q_end", "k_start", "k_end")
UNMODELLED = ("paging_info", "q_indices", "k_indices")  # a paged or gathered attention: no FLOPs


@dataclass(frozen=True)
class Source:
    """Where one set of caches lies: ``data_dir`` holds ``<device_kind>/<op>.json`` (or ``.json.gz``);
    ``shown`` is how an error names that folder; ``url`` the address a row's ``source_file`` is appended
    to ("" for none); ``missing`` why the source gives nothing here (``data_dir`` is None then)."""

    label: str
    data_dir: Path | None
    shown: str
    url: str = ""
    missing: str = ""


@dataclass(frozen=True)
class SourceReading:
    """One source read: its rows, how many cache files, the empty files and the keys without a result it
    skipped, and why it gave nothing (``source.missing``)."""

    source: Source
    rows: tuple[dict, ...] = ()
    files: int = 0
    empty_files: tuple[str, ...] = ()
    without_result: int = 0


@dataclass(frozen=True)
class Shape:
    """A shape string read: ``bf16[32,4096,8,128]`` is dtype ``bfloat16``, dims ``(32, 4096, 8, 128)``."""

    dtype: str
    dims: tuple[int, ...]


def wheel_source() -> Source:
    """The installed tokamax package's caches, found without importing it (it imports jax)."""
    spec = importlib.util.find_spec("tokamax")
    if spec is None or not spec.origin:
        return Source("tokamax wheel", None, CACHE_DIR,
                      missing="tokamax is not installed: its wheel's caches were not read")
    try:
        version = importlib.metadata.version("tokamax")
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    package = Path(spec.origin).resolve().parent  # the package's __file__'s folder
    return Source(f"tokamax {version} wheel", package / "data" / "autotuning", CACHE_DIR)


def vendored_source() -> Source:
    """The repository's caches at ``REPO_COMMIT``, copied into ``data/`` (gzip-compressed)."""
    return Source(f"openxla/tokamax@{REPO_COMMIT[:12]}", VENDORED_DIR, VENDORED_SHOWN, url=REPO_URL)


SOURCES = (wheel_source(), vendored_source())


def parse_shape(text) -> Shape:
    """``bf16[32,4096,8,128]`` -> ``Shape("bfloat16", (32, 4096, 8, 128))``; anything else is a
    ``PublishedError`` (the caller puts the file and entry in front)."""
    match = SHAPE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise PublishedError(f"shape {text!r} is not dtype[d0,d1,...]")
    dims = tuple(int(d) for d in match.group(2).split(",")) if match.group(2) else ()
    return Shape(DTYPES.get(match.group(1), match.group(1)), dims)


def _short(text: str) -> str:
    """The first ``ENTRY_CHARS`` characters of a key, quoted, on one line."""
    cut = text[:ENTRY_CHARS] + ("..." if len(text) > ENTRY_CHARS else "")
    return "'" + cut.encode("unicode_escape").decode("ascii") + "'"


def _shape(spec: dict, name: str, where: str, *, min_dims: int = 0) -> Shape | None:
    """The key's ``name`` shape (None where absent or null and ``min_dims`` is 0)."""
    text = spec.get(name)
    if text is None and not min_dims:
        return None
    if text is None:
        raise PublishedError(f"{where}: no {name} shape")
    try:
        shape = parse_shape(text)
    except PublishedError as exc:
        raise PublishedError(f"{where}: {name} {exc}") from None
    if len(shape.dims) < min_dims:
        raise PublishedError(f"{where}: {name} shape {text!r} has {len(shape.dims)} dims, not "
                             "[*batch, seq, heads, head_dim]")
    return shape


def _mask_text(causal: bool, mask: dict, bias: str | None) -> str:
    """``none``, ``causal``, ``bool[384,1,1,384]``, ``bias bf16[1,4,384,384]``, ... joined by `` + ``."""
    parts = ["causal"] if causal else []
    parts += [f"{name} {mask[name]}" for name in BOUNDS if mask.get(name) is not None]
    if mask.get("bool_mask") is not None:
        parts.append(str(mask["bool_mask"]))
    if bias is not None:
        parts.append(f"bias {bias}")
    return " + ".join(parts) or "none"


def _precision_text(precision) -> str:
    """``[["DEFAULT","DEFAULT"],["DEFAULT","DEFAULT"]]`` -> ``DEFAULT``; distinct values joined by ``/``."""
    if precision is None:
        return ""
    if not isinstance(precision, list):
        return str(precision)
    flat, stack = [], [precision]
    while stack:
        item = stack.pop(0)
        if isinstance(item, list):
            stack[:0] = item
        else:
            flat.append(str(item))
    return "/".join(dict.fromkeys(flat))


def _json_object(text: str, where: str, what: str) -> dict:
    """``text`` (a cache file, or one of its keys or configs) as a JSON object; ``PublishedError``
    naming ``where`` and ``what`` else."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PublishedError(f"{where}: the {what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise PublishedError(f"{where}: the {what} is not a JSON object")
    return value


def parse_spec(key: str, where: str, *, vjp: bool) -> dict:
    """A key's fields as the table's: pass, shape, dtype, mask and what blocks a FLOPs count."""
    spec = _json_object(key, where, "key")
    q, k, v = (_shape(spec, name, where, min_dims=3) for name in "qkv")
    mask = spec.get("mask") or {}
    if not isinstance(mask, dict):
        raise PublishedError(f"{where}: mask is not an object")
    _shape(mask, "bool_mask", where)
    _shape(spec, "bias", where)
    causal = mask.get("is_causal", False)
    if not isinstance(causal, bool):
        raise PublishedError(f"{where}: mask.is_causal {causal!r} is not true or false")
    soft_cap = spec.get("logits_soft_cap")
    fields = {
        "pass": "vjp" if vjp else ("fwd_residuals" if spec.get("return_residuals") is True else "fwd"),
        "batch": math.prod(q.dims[:-3]), "q_heads": q.dims[-2], "kv_heads": k.dims[-2],
        "seq_q": q.dims[-3], "seq_k": k.dims[-3], "head_dim": q.dims[-1], "head_dim_v": v.dims[-1],
        "dtype": q.dtype, "causal": causal, "mask": _mask_text(causal, mask, spec.get("bias")),
        "logits_soft_cap": float(soft_cap) if isinstance(soft_cap, (int, float)) else None,
        "precision": _precision_text(spec.get("precision")),
    }
    return fields | {"no_flops": _flops_blocker(fields, spec, mask)}


def _flops_blocker(fields: dict, spec: dict, mask: dict) -> str:
    """Why the project's FLOPs convention cannot count this entry ("" where it can)."""
    if fields["head_dim"] != fields["head_dim_v"]:
        return f"head_dim {fields['head_dim']} != head_dim_v {fields['head_dim_v']}"
    if mask.get("bool_mask") is not None or spec.get("bias") is not None:
        return "a bool mask or bias: the cache records its shape, not which pairs it keeps"
    if any(mask.get(name) is not None for name in BOUNDS):
        return "q/k start or end bounds"
    if any(spec.get(name) is not None for name in UNMODELLED):
        return "paged or indexed attention"
    if fields["dtype"] not in DTYPE_BYTES:
        return f"dtype {fields['dtype']} is not one the project's Workload takes"
    if fields["causal"] and fields["seq_q"] != fields["seq_k"]:
        return "causal with seq_q != seq_k (tokamax aligns causal top-left, the project bottom-right)"
    return ""


def entry_flops(fields: dict) -> tuple[int | None, str]:
    """``(flops, why not)``: the project's FLOPs of this pass (fwd and fwd_residuals: Workload's fwd; vjp:
    fwd_bwd - fwd, the backward's share), or None and the reason."""
    if fields["no_flops"]:
        return None, f"no FLOPs: {fields['no_flops']}"
    shape = {name: fields[name] for name in ("batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim",
                                             "dtype", "causal")}
    try:
        fwd = Workload(**shape, mode="fwd").flops
        both = Workload(**shape, mode="fwd_bwd").flops
    except ValueError as exc:
        return None, f"no FLOPs: {exc}"
    if fields["pass"] == "vjp":
        return round(both - fwd), "vjp FLOPs are the backward's share (fwd_bwd - fwd)"
    return round(fwd), ""


def _number(result: dict, name: str, where: str) -> float | None:
    value = result.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PublishedError(f"{where}: {name} {value!r} is not a number")
    return float(value)


def _times(result: dict, where: str) -> list[float]:
    """The evaluation times, each a positive finite number of milliseconds, at least one."""
    times = result.get("evaluation_times_ms")
    if not isinstance(times, list) or not times:
        state = "missing" if times is None else "empty" if times == [] else f"not a list: {times!r:.60}"
        raise PublishedError(f"{where}: evaluation_times_ms is {state}")
    for t in times:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise PublishedError(f"{where}: evaluation_times_ms has {t!r}, not a positive number of ms")
    return [float(t) for t in times]


def _figures(result, where: str) -> dict:
    """One config's result as the table's timing columns."""
    if not isinstance(result, dict):
        raise PublishedError(f"{where}: the result is not an object")
    times = _times(result, where)
    median = statistics.median(times)
    metadata = result.get("metadata") if isinstance(result.get("metadata"), dict) else {}
    peak = result if "peak_memory_mb" in result else metadata
    return {
        "n_evaluations": len(times), "median_ms": median, "min_ms": min(times), "max_ms": max(times),
        "spread": (max(times) - min(times)) / median,
        "compile_ms": _number(result, "compile_time_ms", where),
        "lower_ms": _number(result, "lower_time_ms", where),
        "peak_memory_mb": _number(peak, "peak_memory_mb", where),
    }


def _row(base: dict, fields: dict, config: str, result, where: str) -> dict:
    """One table row: the file's columns, the key's, the config's figures, the FLOPs and the note."""
    _json_object(config, where, "config")  # checked: the table keeps the text as the cache wrote it
    figures = _figures(result, where)
    flops, why = entry_flops(fields)
    tflops = flops / (figures["median_ms"] / 1e3) / 1e12 if flops is not None else None
    note = "; ".join(n for n in (base["note"], why) if n)
    row = base | {k: v for k, v in fields.items() if k != "no_flops"} | {"config": config} | figures
    row |= {"flops": flops, "tflops_per_s": tflops, "note": note}
    return {column: row[column] for column in COLUMNS}


def _load(path: Path, shown: str):
    """The file's JSON object, or None where it is empty."""
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise PublishedError(f"{shown}: cannot be read: {exc}") from None
    if not text.strip():
        return None
    return _json_object(text, shown, "file")


def _base(*, source: str, source_file: str, source_url: str, device_kind: str, op: str) -> dict:
    """The columns every row of one file shares."""
    name = op.removesuffix(VJP)
    if name not in OPS:
        raise PublishedError(f"{source_file}: {op!r} is not an attention op this reader knows "
                             f"({', '.join(OPS)})")
    device = DEVICES.get(device_kind, Device(device_kind))
    return {"evidence": "published", "source": source, "source_file": source_file, "source_url": source_url,
            "device_kind": device_kind, "device": device.name, "hardware_profile": device.hardware_profile,
            "target": device.target, "op": name, "kernel": OPS[name].kernel,
            "implementation": OPS[name].implementation, "note": OPS[name].note}


def read_file(path, *, source: str, source_file: str, source_url: str, device_kind: str, op: str,
              shown: str | None = None) -> tuple[list[dict], int, bool]:
    """``(rows, keys without a result, whether the file is empty)`` of one cache file (``.json`` or
    ``.json.gz``); ``shown`` names it in errors (default ``source_file``)."""
    shown = shown or source_file
    base = _base(source=source, source_file=source_file, source_url=source_url, device_kind=device_kind,
                 op=op)
    entries = _load(Path(path), shown)
    if entries is None:
        return [], 0, True
    rows, without = [], 0
    for key, configs in entries.items():
        where = f"{shown}: entry {_short(key)}"
        if not isinstance(configs, dict):
            raise PublishedError(f"{where}: its results are not an object of configs")
        if not configs:
            without += 1
            continue
        fields = parse_spec(key, where, vjp=op.endswith(VJP))
        rows += [_row(base, fields, config, result, f"{where}: config {_short(config)}")
                 for config, result in configs.items()]
    return rows, without, False


def read_cache_file(path, *, source: str, source_file: str, source_url: str, device_kind: str, op: str,
                    shown: str | None = None) -> list[dict]:
    """One cache file's rows: one per (key, config) with a result; an empty file has none."""
    return read_file(path, source=source, source_file=source_file, source_url=source_url,
                     device_kind=device_kind, op=op, shown=shown)[0]


def cache_files(data_dir: Path) -> list[tuple[str, str, Path]]:
    """``(device_kind, op file name, path)`` of every attention cache under ``data_dir``, sorted; a
    ``.json`` is read before a ``.json.gz`` of the same name, never both."""
    found = []
    for device_dir in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        for name in (n for op in OPS for n in (op, op + VJP)):
            paths = [device_dir / f"{name}{ext}" for ext in (".json", ".json.gz")]
            found += [(device_dir.name, name, p) for p in paths if p.is_file()][:1]
    return found


def read_source(source: Source) -> SourceReading:
    """Every attention cache of one source, read."""
    if source.data_dir is None:
        return SourceReading(source)
    if not source.data_dir.is_dir():
        raise PublishedError(f"{source.shown}: no such folder ({source.label})")
    rows, empty, without = [], [], 0
    files = cache_files(source.data_dir)
    for device_kind, op, path in files:
        source_file = f"{CACHE_DIR}/{device_kind}/{op}.json"
        file_rows, file_without, is_empty = read_file(
            path, source=source.label, source_file=source_file,
            source_url=source.url + source_file if source.url else "", device_kind=device_kind, op=op,
            shown=f"{source.shown}/{device_kind}/{path.name}")
        rows += file_rows
        without += file_without
        empty += [source_file] if is_empty else []
    return SourceReading(source, tuple(rows), len(files), tuple(empty), without)


def read_sources(sources=SOURCES) -> list[SourceReading]:
    return [read_source(s) for s in sources]


def rows_frame(readings) -> pd.DataFrame:
    """The readings' rows as one DataFrame with ``COLUMNS``, in reading order."""
    import pandas as pd

    return pd.DataFrame([r for reading in readings for r in reading.rows], columns=list(COLUMNS))


def published_rows(sources=SOURCES) -> pd.DataFrame:
    """Every source's rows: one per (source, device, op, key, config) with a result."""
    return rows_frame(read_sources(sources))
