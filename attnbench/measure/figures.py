"""Every figure that follows from a case's step time: throughput, MFU, bandwidth and cost, with one
formula for a first window and for a static case's pooled timing rounds (``pool_rounds``)."""

from __future__ import annotations

import json

from attnbench import hardware
from attnbench.core import stats
from attnbench.core.workload import Workload
from attnbench.measure import cost


def throughput(workload: Workload, regime: str, seconds_per_step: float,
               regime_result) -> tuple[float | None, float | None]:
    """(tokens/s, FLOP/s) the timed steps really computed, padding included.

    Regimes use the stream's steady steps at their own lengths: the full length's tokens over the
    median step would credit steps with tokens they never ran.
    """
    if regime == "static":
        return workload.tokens / seconds_per_step, workload.flops / seconds_per_step
    return regime_result.steady_tokens_per_s, regime_result.steady_flops_per_s


def price_and_derive(device, workload, options, record, regime_result):
    """Throughput, MFU and cost columns of a measured ``record``; returns the ``Pricing`` used."""
    profile = (hardware.get_hardware_profile(options.hardware_profile) if options.hardware_profile
               else hardware.match_hardware_profile(device))
    peak = hardware.peak_tflops(device, profile, workload.dtype)
    pricing = cost.pricing_for(device, hardware_profile=options.hardware_profile,
                               price_per_hour=options.price_per_hour,
                               spot_price_per_hour=options.spot_price_per_hour,
                               price_kind=options.price_kind, cores=record["threads"])
    record.update(peak_tflops=peak.tflops, peak_source=peak.source)
    if profile is not None and profile.hbm_tb_s is not None:  # decode is memory-bound: bytes/s against it
        record.update(peak_bytes_per_s=profile.hbm_tb_s.value * 1e12,
                      bandwidth_source=f"{profile.name}: {profile.hbm_tb_s.source}")
    tokens_per_s, flops_per_s = throughput(workload, options.regime, record["seconds_per_step"],
                                           regime_result)
    derive_figures(record, pricing, tokens_per_s, flops_per_s)
    return pricing


def derive_figures(record: dict, pricing, tokens_per_s: float | None, flops_per_s: float | None) -> None:
    """Every figure that follows from the step time; one formula for the first figure and for pooled
    rounds."""
    seconds = record["seconds_per_step"]
    record.update(tokens_per_s=tokens_per_s, tflops=flops_per_s / 1e12 if flops_per_s else None,
                  seconds_per_million_tokens=1e6 / tokens_per_s if tokens_per_s else None)
    if record.get("peak_tflops") and record["tflops"]:
        record["mfu"] = record["tflops"] / record["peak_tflops"]
    # Static only: a regime's steps differ in size.
    if record.get("min_bytes") and seconds and record.get("regime", "static") == "static":
        record["bytes_per_s"] = record["min_bytes"] / seconds
        if record.get("peak_bytes_per_s"):
            record["bandwidth_utilisation"] = record["bytes_per_s"] / record["peak_bytes_per_s"]
    tokens_per_step = tokens_per_s * seconds if tokens_per_s else None
    costs = cost.cost_per_step(seconds, pricing, tokens_per_step=tokens_per_step)
    record.update({k: v for k, v in costs.items() if k in record})
    # Compile stalls included, per useful (unpadded) token: the figure to compare across regimes.
    stream = cost.cost_per_step(record["seconds_per_step_with_compiles"], pricing)
    useful_per_step = (record["useful_tokens_per_s"] or 0) * (record["seconds_per_step_with_compiles"] or 0)
    useful = cost.cost_per_step(record["seconds_per_step_with_compiles"], pricing,
                                tokens_per_step=useful_per_step or None)
    for market in ("on_demand", "spot"):
        record[f"usd_per_step_with_compiles_{market}"] = stream[f"usd_per_step_{market}"]
        record[f"usd_per_million_useful_tokens_with_compiles_{market}"] = \
            useful[f"usd_per_million_tokens_{market}"]


def pricing_of(record: dict):
    """The ``Pricing`` a record was costed at (its hourly prices and their source)."""
    return cost.Pricing(device_name=record.get("device") or "", hardware_profile=None, units=None, unit=None,
                        on_demand_usd_per_hour=record.get("usd_per_hour_on_demand"),
                        spot_usd_per_hour=record.get("usd_per_hour_spot"),
                        source=record.get("price_source") or "", note=record.get("cost_note"),
                        kind=record.get("price_kind"))


def pool_rounds(record: dict, rounds: list, *, stopped: str | None = None, complete: bool = True) -> dict:
    """``record`` (a static case's full record) with its step time estimated over its rounds
    (``run.adaptive.RoundValue``s, round 0 its own first window): the median of the rounds' medians
    with the interval over them, at ``stats.CONFIDENCE``.

    Every round is kept with its id (``round_ids``; those another process shared listed in
    ``contended_rounds``): the verdict pairs two kernels by round, shared rounds included; so are a
    probed way's stall probes (``first_call_round_s`` by ``first_call_round_ids``). A figure's
    own median leaves the shared rounds out while a clean one exists; if all were contended, all are
    kept and flagged. Step-time figures are derived again; compile and memory figures stay the
    record's. ``stopped``: why its rounds ended; ``complete``: False while the sweep may add more
    (a resumed sweep goes on from them)."""
    rounds = sorted(rounds, key=lambda r: r.round)
    out = dict(record, rounds_stopped=stopped, rounds_complete=complete)
    clean = [r for r in rounds if not r.contended]
    used = clean or rounds
    pooled = stats.estimate([list(r.samples) or [r.median_s] for r in used])
    controls = [(r.round, r.control_median_s) for r in rounds if r.control_median_s]
    defaults = [(r.round, r.defaults_median_s) for r in rounds if r.defaults_median_s]
    probes = [(r.round, r.first_call_s) for r in rounds if r.first_call_s]
    out.update(seconds_per_step=pooled.median, ci_low_s=pooled.ci_low, ci_high_s=pooled.ci_high,
               ci_basis=pooled.basis, ci_coverage=pooled.coverage, ci_confidence=pooled.confidence,
               ci_method=pooled.method, iqr_s=pooled.q75 - pooled.q25, samples=len(pooled.samples),
               rounds=pooled.rounds, rounds_dropped=len(rounds) - len(used),
               round_medians_s=json.dumps([r.median_s for r in rounds]),
               round_ids=json.dumps([r.round for r in rounds]),
               contended_rounds=json.dumps([r.round for r in rounds if r.contended and clean]),
               control_round_medians_s=json.dumps([m for _, m in controls]) if controls else None,
               control_round_ids=json.dumps([i for i, _ in controls]) if controls else None,
               defaults_round_medians_s=json.dumps([m for _, m in defaults]) if defaults else None,
               defaults_round_ids=json.dumps([i for i, _ in defaults]) if defaults else None,
               first_call_round_s=json.dumps([s for _, s in probes]) if probes else None,
               first_call_round_ids=json.dumps([i for i, _ in probes]) if probes else None,
               timing_samples_s=json.dumps(list(pooled.samples)), contended=not clean,
               contention_reason=_rounds_reason(rounds) if not clean else None)
    if out.get("tokens") and out.get("flops"):
        derive_figures(out, pricing_of(out), out["tokens"] / pooled.median, out["flops"] / pooled.median)
    return out


def _rounds_reason(rounds: list) -> str:
    """Why every round was contended, short: how many, and the first round's reason."""
    reasons = [r.contention_reason for r in rounds if r.contention_reason]
    return f"contended in all {len(rounds)} timing rounds" + (f", e.g. {reasons[0]}" if reasons else "")


def pool_stream_rounds(record: dict, rounds: list, *, stopped: str | None = None,
                       complete: bool = True) -> dict:
    """``record`` (a production stream's way: a case of another regime that a verdict prices) with
    its later rounds kept: each round's mean step of its stream sample, warm (``stream_round_s``, by
    ``stream_round_ids``; round 0, the first pass, is not one of them), and their median with its
    interval (``stream_steady_*``). The record's own figures stay the first pass's stream: the
    verdict prices each round's stream from them, its steady steps at that round's value."""
    later = sorted((r for r in rounds if r.round > 0), key=lambda r: r.round)
    out = dict(record, rounds_stopped=stopped, rounds_complete=complete)
    if not later:
        return out
    pooled = stats.estimate([[r.median_s] for r in later])
    out.update(stream_round_s=json.dumps([r.median_s for r in later]),
               stream_round_ids=json.dumps([r.round for r in later]), stream_rounds=len(later),
               stream_round_median_s=pooled.median, stream_round_ci_low_s=pooled.ci_low,
               stream_round_ci_high_s=pooled.ci_high, stream_round_ci_method=pooled.method)
    return out
