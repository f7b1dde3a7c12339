"""Published device timings (``results/published/``) in the verdict and the report: never measured here.

Two readings of the published table (``attnbench/published/``, Tokamax's autotuning caches):

- ``published_verdicts``: a compile-target row per chip and aligned shape (``published/shapes.py``)
  that ``make published`` compiled, with the published figure of each Tokamax kernel on *that chip*
  and its source beside the compiler's evidence. A chip with no published figure says so; a figure
  from another chip is never put in its place.
- ``on_the_chip``: the chips' own comparisons at each aligned shape: Tokamax's flash kernel at its
  tuned config against XLA chunked and plain XLA, and ``tile_spread``: the tiles the tuning chose
  across shapes on each TPU.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from attnbench.published import shapes
from attnbench.report.compiled_verdict import COLUMNS, mb, predicted_ratio

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

PATH = os.path.join("published", "tokamax.csv")
BASIS = "compiler + published"
# The flash kernel of each kind of chip, in Tokamax's words, and what it is weighed against.
FLASH = {"tpu": ("jax-tokamax-mosaic-tpu",),
         "gpu": ("jax-tokamax-cudnn", "jax-tokamax-mosaic-gpu", "jax-tokamax-triton")}
CHUNKED, PLAIN = "jax-tokamax-xla-chunked", "jax-tokamax-xla"
ON_CHIP_COLUMNS = ["chip", "shape", "fastest", "jax-tokamax-mosaic-tpu", "jax-tokamax-mosaic-gpu",
                   "jax-tokamax-triton", "jax-tokamax-cudnn", CHUNKED, PLAIN, "xla chunked / flash",
                   "flash config (tuned)", "source"]
SPREAD_COLUMNS = ["chip", "kernel", "tiles (block_q x block_kv)", "shapes", "TFLOP/s at those shapes"]


def load_published(results_dir: str = "results") -> pd.DataFrame:
    """The published table, read only (``attnbench.published.table.read_csv``); empty when absent."""
    import pandas as pd

    from attnbench.published.table import COLUMNS as TABLE_COLUMNS
    from attnbench.published.table import read_csv

    path = os.path.join(results_dir, PATH)
    return read_csv(path) if os.path.exists(path) else pd.DataFrame(columns=TABLE_COLUMNS)


def aligned_rows(published) -> pd.DataFrame:
    """The published forward rows at an aligned shape, each with its ``key``; per chip, kernel and
    shape one row: the repository's where it has one (a newer commit than the wheel), the fastest
    config where a source holds several."""
    if published is None or published.empty:
        return published
    rows = published[(published["pass"] == "fwd") & (published["head_dim"] == published["head_dim_v"])
                     & published["mask"].isin(["none", "causal"]) & published["logits_soft_cap"].isna()
                     & published["median_ms"].notna()]
    keys = [shapes.key(batch=r.batch, q_heads=r.q_heads, kv_heads=r.kv_heads, seq_q=r.seq_q, seq_k=r.seq_k,
                       head_dim=r.head_dim, dtype=r.dtype, causal=r.causal) for r in rows.itertuples()]
    aligned = {shapes.workload_key(w) for w in shapes.ALIGNED}
    rows = rows.assign(key=keys)
    rows = rows[rows["key"].isin(aligned)]
    rows = rows.assign(wheel=rows["source"].str.contains("wheel"))
    rows = rows.sort_values(["wheel", "median_ms"]).drop_duplicates(["device_kind", "kernel", "key"])
    return rows.drop(columns="wheel").reset_index(drop=True)


def _figure(r) -> str:
    tflops = f", {r['tflops_per_s']:.0f} TFLOP/s" if r.get("tflops_per_s") == r.get("tflops_per_s") and \
        r.get("tflops_per_s") is not None else ""
    return f"{r['kernel']} {r['median_ms']:.3g} ms{tflops}{_config_words(r.get('config'))}"


def _config_words(config) -> str:
    """`` at block_q=2048,block_kv=2048`` for a tuned config's tiles; ``""`` for none."""
    try:
        values = json.loads(config) if isinstance(config, str) else {}
    except json.JSONDecodeError:
        return ""
    tiles = {k: v for k, v in values.items() if k.startswith("block_") and v is not None}
    return f" at {','.join(f'{k}={v}' for k, v in tiles.items())}" if tiles else ""


def _sources(rows) -> str:
    """``source: file, file`` per source, each file once."""
    out = []
    for source, part in rows.groupby("source", sort=True):
        files = ", ".join(dict.fromkeys(part["source_file"]))
        out.append(f"{source}: {files}")
    return "; ".join(out)


def published_verdicts(records, published) -> pd.DataFrame:
    """One compile-target row per target x aligned shape compiled there (``make published``): the
    compiler's evidence per kernel, and the published figures of that chip at that shape with their
    sources (``published``, ``published_source``), fastest first."""
    import pandas as pd

    if records is None or records.empty:
        return pd.DataFrame(columns=COLUMNS)
    aligned = {shapes.workload_key(w): w for w in shapes.ALIGNED}
    records = records[shapes.at_aligned_shapes(records)]
    records = records.assign(key=shapes.record_keys(records))
    figures = aligned_rows(published)
    rows = []
    for (target, key), part in records.groupby(["target", "key"], sort=True):
        real = part[(part["execution"] != "interpret") & part["status"].isin(["ok", "does-not-fit"])]
        if real.empty:
            continue
        workload = aligned[key]
        here = figures[figures["target"] == target] if figures is not None and len(figures) else None
        here = here[here["key"] == key].sort_values("median_ms") if here is not None else None
        reasons = [_compiled_words(r) for r in real.sort_values("impl").to_dict("records")]
        published_text = source = None
        if here is not None and len(here):
            published_text = "; ".join(_figure(r) for r in here.to_dict("records"))
            source = _sources(here)
            reasons += _config_mismatch(real, here)
            fastest = here.iloc[0]
            sentence = (f"On {target} at {shapes.label(workload)}, published (Tokamax's own timings on this "
                        f"chip, not measured here): {fastest['kernel']} is fastest at "
                        f"{fastest['median_ms']:.3g} ms{_chunked_words(here)}; the compiler here says what "
                        "each kernel becomes and needs on the chip.")
        else:
            sentence = (f"On {target} at {shapes.label(workload)}: no published timing for this chip "
                        "(Tokamax's caches cover the H100, TPU v5p, v6e and 7x); the compiler's word only.")
        predicted = predicted_ratio(real)
        beside = _predicted_beside(real, here)
        if beside:
            reasons.append("predicted beside published: " + "; ".join(beside))
        rows.append({"machine": target, "basis": BASIS, "framework": "jax",
                     "workload": shapes.label(workload).replace(f" S{workload.seq_q}", ""),
                     "seq_len": int(workload.seq_q), "dtype": workload.dtype, "answer": "-", "paper": "-",
                     "flip": "-", "published": published_text, "published_source": source, **predicted,
                     "sentence": sentence, "reasons": "; ".join(reasons)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _predicted_beside(real, here) -> list[str]:
    """``kernel predicted 1.2 ms, published 1.0 ms (1.20x)`` per kernel with both, at this chip and shape
    (the prediction at the config compiled here, the published time at its own config)."""
    if here is None or here.empty or "predicted_seconds" not in real:
        return []
    published = here.drop_duplicates("kernel").set_index("kernel")["median_ms"]
    words = []
    for r in real.sort_values("impl").to_dict("records"):
        predicted = r.get("predicted_seconds")
        if predicted is None or predicted != predicted or r["impl"] not in published.index:
            continue
        ms = predicted * 1e3
        words.append(f"{r['impl']} predicted {ms:.3g} ms, published {published[r['impl']]:.3g} ms "
                     f"({ms / published[r['impl']]:.2f}x)")
    return words


def _compiled_words(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['impl']}: {r['status']} (compiled)"
    fits = "" if str(r.get("fits")) == "True" else ", does not fit"
    config = r.get("library_config")
    built = isinstance(config, str) and config and "no config" not in config
    config = f", built at {config}" if built else ""
    return f"{r['impl']}: peak {mb(r['peak_bytes'])}{fits}, {r['kernel_evidence']}{config} (compiled)"


def _chunked_words(here) -> str:
    """``; XLA chunked 3.9x its time`` when both are published."""
    fastest = here.iloc[0]
    chunked = here[here["kernel"] == CHUNKED]
    if chunked.empty or fastest["kernel"] == CHUNKED:
        return ""
    return f"; {CHUNKED} takes {chunked.iloc[0]['median_ms'] / fastest['median_ms']:.2g}x its time"


def _config_mismatch(real, here) -> list[str]:
    """Where a Tokamax kernel was compiled at another config than the published one (its wheel has no
    cache for the chip: its heuristics), say so: the compiled memory is that config's."""
    out = []
    for r in real.to_dict("records"):
        built = r.get("library_config")
        if not isinstance(built, str) or "block_q" not in built:
            continue
        published = here[here["kernel"] == r["impl"]]
        if published.empty:
            continue
        tuned = _config_words(published.iloc[0].get("config")).replace(" at ", "")
        if tuned and any(f"{part}," not in f"{built}," for part in tuned.split(",")):
            out.append(f"{r['impl']} compiled at Tokamax's own choice here ({built.split(' ', 1)[-1]}), "
                       f"published at {tuned}: the compiled memory is the former's")
    return out


def on_the_chip(published) -> pd.DataFrame:
    """The chips' own comparisons (published, never measured here): per chip and aligned shape, each
    Tokamax kernel's median ms, the fastest, XLA chunked over the chip's fastest flash kernel, and
    that kernel's tuned config."""
    import pandas as pd

    rows_in = aligned_rows(published)
    if rows_in is None or rows_in.empty:
        return pd.DataFrame(columns=ON_CHIP_COLUMNS)
    aligned = {shapes.workload_key(w): w for w in shapes.ALIGNED}
    rows = []
    for (device, key), part in rows_in.groupby(["device", "key"], sort=True):
        times = dict(zip(part["kernel"], part["median_ms"], strict=True))
        flash = part[part["kernel"].isin(FLASH["tpu"] + FLASH["gpu"])].sort_values("median_ms")
        best = part.sort_values("median_ms").iloc[0]
        row = {"chip": device, "shape": shapes.label(aligned[key]),
               "fastest": f"{best['kernel']} ({best['tflops_per_s']:.0f} TFLOP/s)"
               if best["tflops_per_s"] == best["tflops_per_s"] else best["kernel"],
               "source": _sources(part)}
        for kernel in ON_CHIP_COLUMNS[3:9]:
            row[kernel] = f"{times[kernel]:.3g} ms" if kernel in times else "-"
        if len(flash) and CHUNKED in times:
            row["xla chunked / flash"] = f"{times[CHUNKED] / flash.iloc[0]['median_ms']:.2f}x"
            row["flash config (tuned)"] = (f"{flash.iloc[0]['kernel']}"
                                           f"{_config_words(flash.iloc[0]['config'])}")
        else:
            row["xla chunked / flash"] = row["flash config (tuned)"] = "-"
        rows.append(row)
    return pd.DataFrame(rows, columns=ON_CHIP_COLUMNS)


def tile_spread(published) -> pd.DataFrame:
    """Per TPU chip: the tiles Tokamax's tuning kept for its Mosaic kernel across the published causal
    and non-causal forward shapes, with how many shapes each won and their TFLOP/s there. Each shape
    keeps its winner only: the caches publish no losing config, and no 128x128 one."""
    import pandas as pd

    if published is None or published.empty:
        return pd.DataFrame(columns=SPREAD_COLUMNS)
    rows_in = published[(published["kernel"] == "jax-tokamax-mosaic-tpu") & (published["pass"] == "fwd")
                        & published["mask"].isin(["none", "causal"]) & published["tflops_per_s"].notna()]
    rows_in = rows_in.assign(wheel=rows_in["source"].str.contains("wheel"))
    rows_in = rows_in.sort_values(["wheel", "median_ms"]).drop_duplicates(
        ["device_kind", "batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "head_dim_v", "dtype",
         "causal"])
    rows = []
    for device, part in rows_in.groupby("device", sort=True):
        tiles = part["config"].map(
            lambda c: "x".join(str(json.loads(c).get(k)) for k in ("block_q", "block_kv")))
        for tile, group in part.assign(tile=tiles).groupby("tile", sort=False):
            low, high = group["tflops_per_s"].min(), group["tflops_per_s"].max()
            rows.append({"chip": device, "kernel": "jax-tokamax-mosaic-tpu",
                         "tiles (block_q x block_kv)": tile, "shapes": len(group),
                         "TFLOP/s at those shapes": f"{low:.0f}-{high:.0f}"})
    frame = pd.DataFrame(rows, columns=SPREAD_COLUMNS)
    return frame.sort_values(["chip", "shapes"], ascending=[True, False]).reset_index(drop=True)


def measured_at_aligned(results_dir: str = "results") -> pd.DataFrame:
    """What ``attnbench run --published-shapes`` measured at the aligned shapes, from the sweeps'
    tables under ``results/runs/`` (read only): one row per run, chip, kernel and shape, ``ok``
    static cases only, the chip named as Tokamax's caches name it (``device_kind``: jax's device kind,
    lower-cased, spaces as underscores) so that it meets the published rows of the same chip only."""
    import glob

    import pandas as pd

    paths = sorted(glob.glob(os.path.join(results_dir, "runs", "*", "records.csv")))
    frames = [pd.read_csv(p).assign(run=os.path.basename(os.path.dirname(p))) for p in paths]
    needed = {"impl", "device", "status", "regime", "seconds_per_step", "batch", "q_heads", "kv_heads",
              "seq_q", "seq_k", "head_dim", "dtype", "causal", "mode"}
    frames = [f for f in frames if needed <= set(f.columns)]
    if not frames:
        return pd.DataFrame(columns=["run", "device_kind", "kernel", "key", "measured_ms"])
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[(rows["status"] == "ok") & (rows["regime"] == "static") & (rows["mode"] == "fwd")]
    aligned = {shapes.workload_key(w) for w in shapes.ALIGNED}
    keys = [shapes.key(batch=r.batch, q_heads=r.q_heads, kv_heads=r.kv_heads, seq_q=r.seq_q, seq_k=r.seq_k,
                       head_dim=r.head_dim, dtype=r.dtype, causal=r.causal) for r in rows.itertuples()]
    rows = rows.assign(key=keys)
    rows = rows[rows["key"].isin(aligned)]
    return pd.DataFrame({"run": rows["run"], "device_kind": rows["device"].str.lower().str.replace(" ", "_"),
                         "kernel": rows["impl"], "key": rows["key"],
                         "measured_ms": rows["seconds_per_step"] * 1e3}).reset_index(drop=True)


def measured_beside(chips, published, measured) -> pd.DataFrame:
    """``on_the_chip``'s table with a ``measured here`` column: each kernel's time that a run of this
    project measured on the same chip at the same shape (``measured_at_aligned``), newest run first;
    ``-`` where none did."""
    rows_in = aligned_rows(published)
    if chips.empty or measured is None or measured.empty:
        return chips.assign(**{"measured here": "-"})
    kinds = dict(zip(rows_in["device"], rows_in["device_kind"], strict=False))
    labels = {shapes.label(w): shapes.workload_key(w) for w in shapes.ALIGNED}
    newest = measured.sort_values("run", ascending=False).drop_duplicates(["device_kind", "kernel", "key"])
    cells = []
    for r in chips.to_dict("records"):
        here = newest[(newest["device_kind"] == kinds.get(r["chip"])) & (newest["key"] == labels[r["shape"]])]
        cells.append("; ".join(f"{k} {ms:.3g} ms" for k, ms in zip(here["kernel"], here["measured_ms"],
                                                                  strict=True)) or "-")
    return chips.assign(**{"measured here": cells})


COMPILED_COLUMNS = ["target", "shape", "kernel", "status", "peak", "layout copies", "kernel (compiled HLO)",
                    "built at"]


def compiled_at_aligned(records) -> pd.DataFrame:
    """The compiler's word at the aligned shapes (``make published``): per target, shape and kernel, the
    status, peak, layout copies, the kernel it became and the config a library kernel chose."""
    import pandas as pd

    if records is None or records.empty:
        return pd.DataFrame(columns=COMPILED_COLUMNS)
    aligned = {shapes.workload_key(w): w for w in shapes.ALIGNED}
    part = records[shapes.at_aligned_shapes(records)]
    rows = []
    for r, key in zip(part.to_dict("records"), shapes.record_keys(part), strict=True):
        ok = r["status"] == "ok"
        config = r.get("library_config")
        copies = r["inserted_copy_bytes"] if ok else 0
        rows.append({"target": r["target"], "shape": shapes.label(aligned[key]), "kernel": r["impl"],
                     "status": r["status"], "peak": mb(r["peak_bytes"]) if ok else "-",
                     "layout copies": mb(copies) if copies else "-",
                     "kernel (compiled HLO)": r["kernel_evidence"] if ok else str(r.get("reason") or "")[:90],
                     "built at": config.split(" ", 1)[-1] if isinstance(config, str) and "=" in config
                     else "-"})
    return pd.DataFrame(rows, columns=COMPILED_COLUMNS).sort_values(["target", "shape", "kernel"])


def published_part(results_dir: str, records=None) -> dict | None:
    """The report's section "On the chip, published" (``None`` without a published table): the
    chips' own comparisons at the aligned shapes and the tiles the tuning kept, as ``Table``s;
    ``records``: ``load_compiled_records`` already read."""
    from attnbench.report.render import Table

    published = load_published(results_dir)
    if published.empty:
        return None
    from attnbench.report.compiled import load_compiled_records

    chips = measured_beside(on_the_chip(published), published, measured_at_aligned(results_dir))
    spread = tile_spread(published)
    compiled = compiled_at_aligned(load_compiled_records(results_dir) if records is None else records)
    sources = sorted(published["source"].unique())
    return {"rows": len(published), "devices": sorted(published["device"].unique()), "sources": sources,
            "on_chip": Table.of(chips) if not chips.empty else None, "on_chip_frame": chips,
            "spread": Table.of(spread) if not spread.empty else None,
            "compiled": Table.of(compiled) if not compiled.empty else None}
