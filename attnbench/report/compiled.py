"""The report's section "Compiled for, not measured": what each target's compiler decided.

Reads the compiled-for records (the committed ``results/compiled-for/records.csv`` and each run's; a
case compiled more than once keeps its newest) and gives per target: fit by length against the
profile's HBM, peak memory and the roofline bound vs length (axes say "compiled, not measured": no
measured time is ever drawn with them), the layout copies around custom kernels, and the roofline
model of one step and its USD. ``compiled_part`` is the report's hook (``None`` without records).
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

from attnbench.compiled_for.records import load_kept
from attnbench.core.atomic import atomic_write_bytes
from attnbench.published.shapes import at_aligned_shapes
from attnbench.report.plots import colors_by_name, new_figure, png_bytes
from attnbench.report.render import Table

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

RECORDS_DIR = "compiled-for"
# What tells two compiled cases apart: the shape, and what the workload is (a preset and its phase
# and mask: llama-3.1-8b and mistral-7b share a shape, not a mask).
IDENTITY = ["target", "impl", "seq_q", "seq_k", "batch", "q_heads", "kv_heads", "head_dim", "dtype",
            "causal", "mode", "workload", "phase", "mask"]
MAX_ROWS = 40


def record_files(results_dir: str) -> list[str]:
    """The committed table first, then every run's, oldest run first (run folders are UTC stamps)."""
    base = os.path.join(results_dir, RECORDS_DIR)
    files = [os.path.join(base, f"records.{ext}") for ext in ("csv", "parquet")]
    runs = sorted(glob.glob(os.path.join(base, "runs", "*", "records.csv"))
                  + glob.glob(os.path.join(base, "runs", "*", "records.parquet")))
    return [f for f in files if os.path.exists(f)] + runs


def load_compiled_records(results_dir: str = "results") -> pd.DataFrame:
    """Every compiled-for record under ``results_dir``, one row per case (the newest)."""
    import pandas as pd

    frames = []
    for path in record_files(results_dir):
        frame = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
        frame["source"] = os.path.relpath(path, results_dir)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=IDENTITY + ["status", "fits", "source"])
    frame = pd.concat(frames, ignore_index=True)
    for column in IDENTITY:  # older tables have no workload, phase or mask: the B1 H8 D64 shape's
        if column not in frame:
            frame[column] = None
    return frame.drop_duplicates(subset=IDENTITY, keep="last").reset_index(drop=True)


def _gb(value) -> str:
    if value is None or value != value:
        return "-"
    return f"{value / 1e9:.3g} GB" if value >= 1e8 else f"{value / 1e6:.3g} MB"


def _truthy(value) -> bool | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def fits_cell(row) -> str:
    """One case in words: ``fits (0.81 GB)``, ``does not fit (206 GB)``, ``refused by the compiler
    (needs 142 GB)``, ``kernel refused``, ``n/a`` (unsupported), ``timeout``, ``error``."""
    status, fits = row.get("status"), _truthy(row.get("fits"))
    if status == "ok":
        return f"{'fits' if fits else 'does not fit'} ({_gb(row.get('peak_bytes'))})"
    if status == "does-not-fit":
        return f"refused: HBM (needs {_gb(row.get('compiler_required_bytes'))})"
    if status == "unsupported":
        return "n/a"
    return str(status)


def _case_label(row) -> str:
    return f"{row['impl']} {row['mode']}" + ("" if row["dtype"] == "bfloat16" else f" {row['dtype']}")


def fits_table(part: pd.DataFrame) -> pd.DataFrame:
    """Implementation x mode (rows) by length (columns): ``fits_cell``."""
    return _pivot(part, fits_cell)


def _pivot(rows: pd.DataFrame, cell) -> pd.DataFrame:
    import pandas as pd

    if rows.empty:
        return pd.DataFrame()
    cells = rows.assign(case=rows.apply(_case_label, axis=1), cell=rows.apply(cell, axis=1))
    table = cells.pivot_table(index="case", columns="seq_q", values="cell", aggfunc="first")
    table.columns = [f"{int(c)}" for c in table.columns]
    return table.reset_index().rename(columns={"case": "implementation mode"}).fillna("-")


def copies_table(part: pd.DataFrame) -> pd.DataFrame:
    """Bytes of the layout copies the compiler inserted around custom kernels, of the peak, by
    length (implementations with none anywhere are left out)."""
    with_copies = part.loc[part["inserted_copy_bytes"].fillna(0) > 0, "impl"].unique()
    rows = part[(part["status"] == "ok") & part["impl"].isin(with_copies)]
    return _pivot(rows, lambda r: f"{_gb(r['inserted_copy_bytes'])} of {_gb(r['peak_bytes'])}")


PRICE_KIND_WORDS = {"instance": "a whole instance's price (the chip with its host)",
                    "accelerator": "the accelerator's price alone (no host VM)"}


def price_kind_text(part: pd.DataFrame) -> str:
    """What the roofline's USD buys on this target: its records' ``price_kind`` (a report reads no
    hardware profile: records compiled before it was kept say so, and the profile's ``price.kind``
    in ``hardware_profiles.toml`` tells)."""
    kinds = sorted(set(part["price_kind"].dropna())) if "price_kind" in part else []
    if not kinds:
        return ("its kind not recorded (compiled before 2026-12-06: the hardware profile's price.kind "
                "says whether it is a whole instance or the accelerator alone)")
    return " and ".join(PRICE_KIND_WORDS.get(k, k) for k in kinds)


def roofline_table(part: pd.DataFrame) -> pd.DataFrame:
    """The roofline model of one step by length, where the program compiled: ``ms / USD (bound)``,
    the bound ``c`` (compute) or ``m`` (memory); ``*``: it does not fit the device."""
    ok = part[part["status"] == "ok"]

    def cell(r):
        usd = r["model_roofline_usd"]
        price = f"${usd:.2g}" if usd == usd and usd is not None else "-"
        bound = str(r["model_roofline_bound"] or "?")[:1]
        return (f"{r['model_roofline_seconds'] * 1e3:.3g} ms / {price} ({bound})"
                + ("" if _truthy(r["fits"]) else " *"))

    return _pivot(ok, cell)


def kernels_table(part: pd.DataFrame) -> pd.DataFrame:
    """Which kernel each implementation became (``kernel_evidence`` of its longest compiled case)."""
    import pandas as pd

    ok = part[part["status"] == "ok"].sort_values("seq_q")
    if ok.empty:
        return pd.DataFrame()
    last = ok.groupby(["impl", "mode"], sort=True).tail(1)
    return pd.DataFrame({"implementation": last["impl"], "mode": last["mode"],
                         # object first: a column with no text yet is float NaN, and pandas will
                         # refuse to fill a float column with text
                         "execution": last["execution"].astype(object).fillna("-"), "at": last["seq_q"],
                         "kernel (compiled HLO)": last["kernel_evidence"].astype(object).fillna("-")})


def grid(part: pd.DataFrame) -> pd.DataFrame:
    """The lengths a sweep asked for (powers of two), without the ones a bisection visited."""
    lengths = part["seq_q"].astype(int)
    return part[(lengths & (lengths - 1)) == 0]


def _load_table(results_dir: str, name: str, keys: list[str]) -> pd.DataFrame:
    """``name`` (``max_seq.csv``, ``max_batch.csv``): the committed table, then each run's, the
    newest row of a case winning."""
    import pandas as pd

    base = os.path.join(results_dir, RECORDS_DIR)
    paths = [os.path.join(base, name)] + sorted(glob.glob(os.path.join(base, "runs", "*", name)))
    frames = [pd.read_csv(p) for p in paths if os.path.exists(p)]
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True)
    for key, older in (("workload", "custom"), ("phase", "prefill")):  # older tables: the B1 H8 D64 shape
        if key in keys:
            table[key] = table[key].fillna(older) if key in table else older
    return table.drop_duplicates(keys, keep="last").reset_index(drop=True)


def max_seq_table(results_dir: str, target: str) -> pd.DataFrame:
    """``max_seq.csv`` (``compile-for --max-seq``) rows of ``target``, newest file last wins."""
    import pandas as pd

    table = _load_table(results_dir, "max_seq.csv", ["target", "impl", "mode", "dtype"])
    if not table.empty:
        table = table[table["target"] == target]
    if table.empty:
        return pd.DataFrame()

    def stop(text):
        if not isinstance(text, str):
            return "-"
        return text if len(text) <= 70 else text[:67] + "..."

    return pd.DataFrame({
        "implementation": table["impl"], "mode": table["mode"], "dtype": table["dtype"],
        "execution": table.get("execution", pd.Series(dtype=object)).fillna("-"),
        "longest feasible": table["max_feasible_seq"].map(lambda v: f"{int(v)}" if v == v else "none"),
        "tried up to": table["tried_up_to"], "stopped by": table["stopped_by"].map(stop)})


def load_max_batch(results_dir: str) -> pd.DataFrame:
    """The raw ``max_batch.csv`` rows (``compile-for --max-batch``), newest file last wins; older tables
    hold the B1 H8 D64 shape only (workload ``custom``)."""
    return _load_table(results_dir, "max_batch.csv", ["target", "impl", "workload", "phase", "mode", "dtype",
                                                      "seq_len"])


def tuned_tiles_table(results_dir: str, target: str | None = None) -> pd.DataFrame:
    """The kept tiles for reading, of ``target`` or of every target: compiled, not run (speed modelled)."""
    import pandas as pd

    table = load_kept(results_dir)  # results/tuning/compiled-for-kept.csv (attnbench tune-targets)
    if target is not None and not table.empty:
        table = table[table["target"] == target]
    if table.empty:
        return pd.DataFrame()

    def count(value):
        return f"{int(value)}" if value == value and value is not None else "-"

    columns = {"target": table["target"]} if target is None else {}
    columns.update({
        "implementation": table["impl"], "workload": table["workload"] + " " + table["phase"],
        "length": table["seq_len"], "kept tiles": table["kept_config"].fillna("none fits"),
        "source": table["config_source"].fillna("-"),
        "feasible / candidates": [f"{count(f)} / {count(c)}" for f, c in
                                  zip(table["feasible"], table["candidates"], strict=True)],
        "largest batch": table["max_batch"].map(count),
        "defaults' batch": table["defaults_max_batch"].map(count),
        "kernel VMEM": table["kernel_vmem_bytes"].map(_gb), "temporaries": table["temp_bytes"].map(_gb),
        "why (speed modelled, not measured)": table["why"].fillna("-")})
    return pd.DataFrame(columns).reset_index(drop=True)


def max_batch_table(results_dir: str, target: str | None = None) -> pd.DataFrame:
    """``max_batch.csv`` rows for reading, of ``target`` or of every target (``target`` column first)."""
    import pandas as pd

    table = load_max_batch(results_dir)
    if target is not None and not table.empty:
        table = table[table["target"] == target]
    if table.empty:
        return pd.DataFrame()

    def text(value, limit=70):
        if not isinstance(value, str):
            return "-"
        return value if len(value) <= limit else value[:limit - 3] + "..."

    def batch(row):  # none: not even batch 1 fits; -: not bisected (unsupported, the interpreter)
        if row["max_batch"] != row["max_batch"]:
            return "-" if _truthy(row["capped"]) is None else "none"
        return f"{int(row['max_batch'])}" + (" (capped)" if _truthy(row["capped"]) else "")

    columns = {"target": table["target"]} if target is None else {}
    columns.update({
        "implementation": table["impl"], "mode": table["mode"], "dtype": table["dtype"],
        "length": table["seq_len"], "execution": table["execution"].astype(object).fillna("-"),
        "largest batch": table.apply(batch, axis=1), "tried up to": table["tried_up_to"],
        "tokens per chip": table["tokens_per_chip"].map(lambda v: f"{int(v)}" if v == v else "-"),
        "peak at max": table["peak_bytes_at_max"].map(_gb),
        "copies at max": table["inserted_copy_bytes_at_max"].map(_gb),
        "stopped by": table["stopped_by"].map(text), "skipped": table["skipped"].map(text)})
    return pd.DataFrame(columns).reset_index(drop=True)


def plot_target(part: pd.DataFrame, target: str, hbm_bytes: float | None) -> bytes | None:
    """Peak memory per device vs length (HBM line; refusals at what the compiler said they need)
    and the roofline model vs length: one figure, nothing measured on it."""
    part = part[part["status"].isin(["ok", "does-not-fit"])]
    if part.empty:
        return None
    fig, axes = new_figure(1, 2, width=5.6, height=3.8)
    mem, model = axes[0][0], axes[0][1]
    colors = colors_by_name(part["impl"])
    for (impl, mode), rows in part.sort_values("seq_q").groupby(["impl", "mode"]):
        style = "-" if mode == "fwd" else "--"
        ok = rows[rows["status"] == "ok"]
        label = f"{impl} {mode}"
        if not ok.empty:
            mem.plot(ok["seq_q"], ok["peak_bytes"], style, marker="o", ms=3, color=colors[impl], label=label)
            model.plot(ok["seq_q"], ok["model_roofline_seconds"] * 1e3, style, marker="o", ms=3,
                       color=colors[impl], label=label)
        refused = rows[(rows["status"] == "does-not-fit") & rows["compiler_required_bytes"].notna()]
        if not refused.empty:
            mem.plot(refused["seq_q"], refused["compiler_required_bytes"], "x", ms=7, color=colors[impl],
                     label=None if not ok.empty else label)
    if hbm_bytes:
        mem.axhline(hbm_bytes, color="red", lw=1)
        mem.annotate("HBM per device", (part["seq_q"].min(), hbm_bytes), color="red", fontsize=7,
                     va="bottom")
    for ax in (mem, model):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.grid(True, which="both", alpha=0.3)
    mem.set_ylabel("peak bytes per device (compiler)")
    mem.set_title(f"{target}: memory_analysis, not measured", fontsize=9)
    model.set_ylabel("ms per step: roofline MODEL, not measured")
    model.set_title(f"{target}: roofline lower bound (model)", fontsize=9)
    handles, labels = mem.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=7,
               title="solid fwd, dashed fwd_bwd; x: refused, at what the compiler needed", title_fontsize=7)
    return png_bytes(fig)


def summary_sentence(part: pd.DataFrame, target: str) -> str:
    first = part.iloc[0]
    versions = ", ".join(f"{lib} {first[lib]}" for lib in ("jax", "libtpu", "jax_cuda12_plugin", "cudnn")
                         if lib in part and first.get(lib) == first.get(lib) and first.get(lib))
    where = first.get("topology") or ""
    counts = part["status"].value_counts().to_dict()
    said = ", ".join(f"{n} {status}" for status, n in counts.items())
    shape = (f"B{int(first['batch'])} H{int(first['q_heads'])} D{int(first['head_dim'])}"
             f"{' causal' if _truthy(first['causal']) else ''}")
    return (f"`{target}` ({where}, hardware profile `{first['hardware_profile']}`, {int(first['chips'])} "
            f"chip(s), {int(first['devices']) if first['devices'] == first['devices'] else '?'} device(s)): "
            f"{len(part)} cases of {shape} ({said}); compiled by {versions or 'unrecorded versions'} on a "
            "host without the target, so nothing here ran on it.")


def compiled_part(results_dir: str, out_dir: str | None = None, records=None) -> dict | None:
    """The section's context (``templates/compiled.j2``) and PNGs (written into ``out_dir``). The
    records at the published shapes are left to their own section (``report/published.py``): their
    lengths are another shape's, never one column of this section's tables. ``records``:
    ``load_compiled_records`` already read."""
    records = load_compiled_records(results_dir) if records is None else records
    records = records[~at_aligned_shapes(records)] if not records.empty else records
    if records.empty:
        return None
    targets, images, plots = [], {}, {}
    for target, part in records.groupby("target", sort=False):
        hbm = part["hbm_bytes"].dropna()
        name = f"compiled_{target}.png"
        swept = grid(part)
        png = plot_target(swept, target, float(hbm.iloc[0]) if not hbm.empty else None)
        if png is not None:
            images[name] = png
            if out_dir:
                plots[name] = os.path.join(out_dir, name)
                atomic_write_bytes(plots[name], png)
        targets.append({"name": target, "sentence": summary_sentence(part, target),
                        "fits": Table.of(fits_table(swept)), "copies": Table.of(copies_table(swept)),
                        "roofline": Table.of(roofline_table(swept)), "price": price_kind_text(part),
                        "kernels": Table.of(kernels_table(swept)),
                        "max_seq": Table.of(max_seq_table(results_dir, target)),
                        "tuned": Table.of(tuned_tiles_table(results_dir, target)),
                        "figure": name if png else None})
    sources = sorted(records["source"].unique())
    return {"targets": targets, "sources": sources, "images": images, "plots": plots,
            "cases": len(records)}
