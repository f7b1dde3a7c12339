"""The verdict's compile-target rows (``h200``, ``tpu-v5e``, ``tpu-v6e``): nothing ran there, so the
compiler's word only: what compiles and fits, the largest batch each kernel fits (``compile-for
--max-batch``), the layout copies, the roofline as a bound that never ranks kernels, and each tiled
kernel's kept tile config on that target (``attnbench tune-targets``, results/tuning/compiled-for-kept.csv).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attention_impls.base import FORCED_FLASH as FORCED_LABEL
from attention_impls.base import NATIVE as NATIVE_LABEL
from attnbench.core.workload import CUSTOM
from attnbench.published.shapes import at_aligned_shapes
from attnbench.report.compiled import grid as grid_lengths

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

FORWARD = "causal B1 H8 D64"  # the Forward and Training classes' workload
COLUMNS = [
    "machine", "basis", "framework", "workload", "seq_len", "dtype",
    "answer", "forced", "native", "ratio", "ratio_low", "ratio_high", "ratio_of",
    "horizon", "horizon_steps", "holds",
    "cold_start", "cold_start_ratio", "cold_start_low", "cold_start_high",
    "serving", "serving_ratio", "serving_low", "serving_high", "forced_cold_start_s", "native_cold_start_s",
    "forced_train_bytes", "native_train_bytes", "train_memory_source",
    "paper", "paper_ratio", "paper_low", "paper_high", "paper_rounds", "flip",
    "break_even", "break_even_low", "break_even_high", "break_even_of",
    "production_strategy", "production", "production_steps", "production_source", "production_measured",
    "headroom_winner", "published", "published_source",
    "predicted", "predicted_forced", "predicted_native", "predicted_ratio", "predicted_ratio_low",
    "predicted_ratio_high", "predicted_extrapolated", "predicted_note", "sentence", "reasons",
]


def same_workload(cell_workload: str, row_workload: str) -> bool:
    """Whether a release cell's workload (``causal-256``, ``mistral-7b-prefill-128``) is this row's kind:
    the B1 H8 D64 causal shape, or the same preset and phase."""
    cell = str(cell_workload)
    if row_workload.startswith(FORWARD):  # the matrix times the forward step only
        return row_workload == FORWARD and cell.startswith("causal")
    preset = row_workload.replace(" ", "-")
    return cell.startswith(preset)


def mb(value) -> str:
    return f"{value / 1e6:.3g} MB" if value < 1e9 else f"{value / 1e9:.3g} GB"


def tuned_words(tuning, target: str, name: str, phase: str, length: int, *, short: bool = False) -> list[str]:
    """``kernel: tiles (source)`` per tiled kernel kept on ``target`` for this preset case, from
    ``tune-targets``' kept table (a preset's only: the tuner compiles presets at their real lengths)."""
    if tuning is None or len(tuning) == 0 or name == CUSTOM:
        return []
    here = tuning[(tuning["target"] == target) & (tuning["workload"] == name) & (tuning["phase"] == phase)
                  & (tuning["seq_len"] == length)]
    words = []
    for r in here.to_dict("records"):
        kept = r.get("kept_config")
        if isinstance(kept, str) and kept:
            source = r.get("config_source") or "tuned"
            words.append(f"{r['impl']} its defaults" if short and source == "defaults" else
                         f"{r['impl']} {kept} ({source})")
        elif (r.get("compiled") or 0) > 0:
            words.append(f"{r['impl']} none of {int(r['candidates'])} fits")
    return words


def compiled_verdicts(records, max_batch=None, *, fragility: list | None = None,
                      tuning=None) -> pd.DataFrame:
    """Per compile target x mode x length with a max-batch search (else every grid length): which
    kernels compile and fit, the largest batch each fits, layout copies, the roofline bound, and the
    kept tiles (``tuning``: ``compiled_for.records.load_kept``)."""
    import pandas as pd

    breaks = fragility if isinstance(fragility, list) else []
    if records is None or records.empty:
        return pd.DataFrame(columns=COLUMNS)

    cases = _compiled_cases(records)
    batches = max_batch if max_batch is not None and not max_batch.empty else None
    if batches is not None:
        batches = batches.assign(  # older tables: the B1 H8 D64 shape's
            workload=batches["workload"].fillna(CUSTOM) if "workload" in batches else CUSTOM,
            phase=batches["phase"].fillna("prefill") if "phase" in batches else "prefill")
        wanted = set(zip(batches["target"], batches["workload"], batches["phase"], batches["mode"],
                         batches["seq_len"], strict=True))
        cases = cases[[k in wanted for k in zip(cases["target"], cases["workload"], cases["phase"],
                                                 cases["mode"], cases["length"], strict=True)]]
    rows = []
    keys = ["target", "workload", "phase", "mode", "length", "dtype"]
    for (target, name, phase, mode, seq, dtype), part in cases.groupby(keys, sort=True):
        real = part[(part["execution"] != "interpret") & (part["status"].isin(["ok", "does-not-fit"]))]
        if real.empty:
            continue
        reasons = []
        bound = real["model_roofline_seconds"].dropna()
        if len(bound):
            reasons.append(f"roofline bound {bound.min() * 1e3:.3g} ms at 100% of peak (a bound, not a rank)")
        refused = real[(real["status"] == "does-not-fit") | (real["fits"].astype(str) != "True")]
        for batch, impls in refused.groupby("batch", sort=True)["impl"]:  # a preset's own batch, else 1
            reasons.append(f"does not fit at batch {int(batch)}: " + ", ".join(impls))
        here = (
            batches[
                (batches["target"] == target)
                & (batches["workload"] == name)
                & (batches["phase"] == phase)
                & (batches["mode"] == mode)
                & (batches["seq_len"] == seq)
                & batches["impl"].isin(real["impl"])
                & batches["max_batch"].notna()
            ]
            if batches is not None
            else None
        )
        headroom = None
        if here is None or here.empty:  # no batch search: the copies at batch 1
            for r in real[real["inserted_copy_bytes"].fillna(0) > 0].itertuples(index=False):
                reasons.append(f"{r.label} {r.impl}: layout copies +{mb(r.inserted_copy_bytes)} at batch 1")
        else:
            here = here.sort_values("max_batch", ascending=False)
            best = here["max_batch"].max()
            headroom = ", ".join(here[here["max_batch"] == best]["impl"])
            reasons.append("largest batch: " + ", ".join(_batch_words(r) for r in here.to_dict("records")))
            winner = here.iloc[0]["impl"]
            for r in here.to_dict("records"):
                # Copy bytes are what the inserted copies write per step, not memory live at once.
                copies = r.get("inserted_copy_bytes_at_max") or 0
                if r["max_batch"] < best and copies > 0:
                    reasons.append(
                        f"{r['impl']} fits {r['max_batch'] / best:.2f}x the tokens per chip of {winner}, "
                        f"and its layout copies write {mb(copies)} per step there"
                    )
        reasons.extend(_compiled_visibility(real))
        predicted = predicted_ratio(real)
        tiles = tuned_words(tuning, target, name, phase, int(seq))
        short = tuned_words(tuning, target, name, phase, int(seq), short=True)
        if tiles:
            reasons.append("tiles kept on the compiler's memory (tokens per chip; speed modelled, not "
                           "measured): " + ", ".join(tiles))
        workload = (f"{name} {phase}" if name != CUSTOM else
                    FORWARD + (" fwd+bwd" if mode == "fwd_bwd" else ""))
        for impl in real["impl"]:
            seen = [b for b in breaks
                    if b["impl"] == impl and b["target"] == target
                    and same_workload(b["workload"], workload)]
            for cause in dict.fromkeys(b["cause"] for b in seen):
                releases = ", ".join(dict.fromkeys(f"{b['framework']} {b['release']}" for b in seen
                                                   if b["cause"] == cause))
                reasons.append(f"{impl} broke in {releases} ({cause}, compiled for {target})")
        rows.append(
            {
                "machine": target,
                "basis": "compiler only",
                "framework": "jax",
                "workload": workload,
                "seq_len": int(seq),
                "dtype": dtype,
                "answer": "-",
                "paper": "-",
                "flip": "-",
                "headroom_winner": headroom,
                **predicted,
                "sentence": (f"On {target} the compiler fits the most tokens per chip with {headroom}; "
                             "nothing ran there, so which is cheaper also depends on speed, which only the "
                             "hardware measures." if headroom else
                             f"On {target} the compiler's word only: what compiles and fits, at batch 1.")
                + (f" Tiles kept for {target}: {'; '.join(short)}." if tiles else "")
                + (f" {predicted['predicted_note']}." if predicted.get("predicted_note") else ""),
                "reasons": "; ".join(reasons),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _compiled_cases(records) -> pd.DataFrame:
    """The compiled records a verdict row reads, with ``length`` (a decode's cache, else the
    sequence): the B1 H8 D64 grid's lengths (not a bisection's), and each preset's cases at its own
    batch. Older tables have no ``workload``: the B1 H8 D64 shape's."""
    import pandas as pd

    records = records[~at_aligned_shapes(records)]  # the published shapes' rows are report/published.py's
    named = records["workload"].fillna(CUSTOM) if "workload" in records else CUSTOM
    records = records.assign(workload=named)
    phase = records["phase"] if "phase" in records else None
    records = records.assign(phase=phase.fillna("prefill") if phase is not None else "prefill")
    custom = records[(records["workload"] == CUSTOM) & (records["batch"] == 1)
                     & (records["seq_q"] == records["seq_k"])]
    custom = grid_lengths(custom)
    preset = records[records["workload"] != CUSTOM]
    both = pd.concat([custom, preset], ignore_index=True) if len(preset) else custom
    decode = both["phase"] == "decode"
    return both.assign(length=both["seq_k"].where(decode, both["seq_q"]).astype(int))


def _compiled_visibility(real) -> list[str]:
    """What a profiler on the target could name, read from the compiled program: a named custom call
    (the kernel as one op) or fused XLA ops (named by opcode); said once where every kernel agrees."""
    if "custom_calls" not in real:
        return []
    named, fused = [], []
    for r in real.to_dict("records"):
        calls = str(r.get("custom_calls") or "")
        if calls and calls not in ("none", "nan"):
            named.append(f"{r['impl']} ({calls})")
        elif calls == "none":
            fused.append(r["impl"])
    if not named and not fused:
        return []
    if not named or not fused:
        return ["from the compiled program, every kernel here is "
                + ("a named custom call" if named else "fused XLA ops a profiler names by opcode")]
    return [f"from the compiled program: named custom calls {', '.join(named)}; fused XLA ops, named by "
            f"opcode, {', '.join(fused)}"]


def _batch_words(row: dict) -> str:
    capped = str(row.get("capped")) == "True"  # the search's upper end fits: at least that
    return f"{row['impl']} {'>=' if capped else ''}{int(row['max_batch'])}"


def predicted_ratio(real) -> dict:
    """The predicted forced / native step time on a compile target (``attnbench.predicted``): the
    fastest predicted kernel of each side that compiles and fits, the ratio's range at its widest
    (forced's low over native's high, forced's high over native's low); ``forced``/``native`` when
    that range lies wholly on one side of 1, else ``can't tell``. Never measured; never reached where
    the family's model fails its bars."""
    from attnbench.report.answers import CANT_TELL, FORCED, NATIVE

    out = {"predicted": "-"}
    if "predicted_seconds" not in real:
        out["predicted_note"] = "No predicted time: these records were compiled before the time model"
        return out
    fits = real[(real["status"] == "ok") & (real["fits"].astype(str) == "True")]
    have = fits[fits["predicted_seconds"].notna()]
    if have.empty:
        if "mode" in fits and len(fits) and (fits["mode"] == "fwd_bwd").all():
            out["predicted_note"] = ("No predicted time: the time model is calibrated on forward programs "
                                     "only (the published backward times are the backward's share)")
            return out
        why = fits["predicted_basis"].dropna()
        out["predicted_note"] = ("No predicted time: " + str(why.iloc[0]).removeprefix("no prediction: ")
                                 if len(why) else "No predicted time: these records carry none")
        return out
    if "predicted_ranks" in have and not have["predicted_ranks"].astype(str).eq("True").all():
        out["predicted_note"] = ("Speed not predicted here: the time model misses its bars on this chip "
                                 "family (docs/compiled-for.md#predicted-speed), so memory, not speed")
        return out
    forced = have[have["label"] == FORCED_LABEL].sort_values("predicted_seconds")
    native = have[have["label"] == NATIVE_LABEL].sort_values("predicted_seconds")
    if forced.empty or native.empty:
        side = "forced-flash" if forced.empty else "native"
        out["predicted_note"] = f"No predicted ratio: no {side} kernel here has a predicted time"
        return out
    f, n = forced.iloc[0], native.iloc[0]
    ratio = f["predicted_seconds"] / n["predicted_seconds"]
    low = f["predicted_seconds_low"] / n["predicted_seconds_high"]
    high = f["predicted_seconds_high"] / n["predicted_seconds_low"]
    state = FORCED if high < 1 else NATIVE if low > 1 else CANT_TELL
    outside = [str(r.get("predicted_basis") or "").partition("outside the calibration (")[2].partition(")")[0]
               for r in (f, n)]
    extrapolated = "; ".join(dict.fromkeys(o for o in outside if o))
    out.update(predicted=state, predicted_forced=f["impl"], predicted_native=n["impl"], predicted_ratio=ratio,
               predicted_ratio_low=low, predicted_ratio_high=high, predicted_extrapolated=bool(extrapolated),
               predicted_note=(f"Predicted, not measured: {f['impl']} / {n['impl']} = {ratio:.2f} "
                               f"({low:.2f}-{high:.2f}), {state}"
                               + (f"; extrapolated ({extrapolated}): the range is the calibration's "
                                  "error, not measured there" if extrapolated else "")))
    return out
