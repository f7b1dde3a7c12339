"""What an upgrade costs, per kernel: each consecutive release pair's speed ratio and state
(``upgrade.py``, measured on this host), its memory change on each chip (``memory.py``, compiled),
and the first release that broke, slowed or bloated the kernel, with the last good one. Read only:
from ``upgrades.csv``, ``releases.csv`` and the memory alerts (``memory.changes`` of ``releases.csv``
and ``planted.csv``, computed once by the caller).
"""

from __future__ import annotations

from attnbench.releases import matrix, memory, upgrade
from attnbench.releases.table import first_breaks, upgrade_steps


def _speed(row: dict) -> str:
    if row["state"] == upgrade.NOT_TIMED or row["ratio"] != row["ratio"]:
        return row["state"]
    return (f"{row['ratio']:.2f}x [{row['ratio_low']:.2f}-{row['ratio_high']:.2f}] {row['state']}, "
            f"{int(row['rounds'])} rounds")


def _jax_build(release: str) -> str | None:
    libtpu = matrix.pinned_libtpu(release)
    return f"jax {release} + libtpu {libtpu}" if libtpu else None


def _memory_by_step(alerts: list[dict]) -> dict[tuple, list[str]]:
    """``{(jax before, jax after, kernel): ["tpu-v5e 4k: temporaries +40%", ...]}`` on the jax[tpu] path
    and the planted builds (the release after named ``V+planted-bloat``)."""
    out: dict[tuple, list[str]] = {}
    for a in alerts:
        if a["axis"] not in ("jax[tpu]", "planted"):
            continue
        before = a["before"].split(" + ")[0].removeprefix("jax ")
        after = a["after"].split(" + ")[0].removeprefix("jax ")
        if a["axis"] == "planted":
            after += f"+{memory.PLANTED_TAG}"
        words = f"{a['target']} {a['seq_len'] // 1024}k: {a['figure']} {memory.percent(a['change'])}"
        out.setdefault((before, after, a["impl"]), []).append(words)
    return out


def per_step(upgrades, releases=None, alerts=()):
    """One row per kernel x upgrade step (and the A/A controls and planted steps, so labelled) where
    the kernel was timed on either workload: the speed of each workload, and the step's compiled
    memory change on the chips where the matrix has a libtpu for both releases (``none`` where it
    held, ``n/a`` where it has none)."""
    import pandas as pd

    grown = _memory_by_step(alerts)
    compiled = set()
    if releases is not None:
        tpu = memory.builds(releases)
        compiled = set(zip(tpu["jax_release"].astype(str), tpu["impl"], strict=True))
    rows = []
    for (kind, framework, step, before, after, impl), part in upgrades.groupby(
            ["kind", "framework", "step", "before", "after", "impl"], sort=False):
        if (part["state"] == upgrade.NOT_TIMED).all():  # refused here (another platform's kernel)
            continue
        speeds = {r["workload"]: _speed(r) for r in part.to_dict("records")}
        if framework == "jax" and (before, impl) in compiled and (
                after.split("+")[0], impl) in compiled:
            memory_text = "; ".join(grown.get((before, after, impl), [])) or "none"
        else:
            memory_text = "n/a"
        speed_columns = {f"speed: {w}": s for w, s in speeds.items()}
        rows.append({"framework": framework, "kind": kind, "step": step, "impl": impl, **speed_columns,
                     "memory on the chips": memory_text})
    frame = pd.DataFrame(rows)
    order = {upgrade.UPGRADE: 0, upgrade.CONTROL: 1, upgrade.PLANTED: 2}
    if frame.empty:
        return frame
    frame["_k"] = frame["kind"].map(order)
    frame["_v"] = frame["step"].map(lambda s: matrix.version_key(s.split()[1]))
    return frame.sort_values(["_k", "impl", "_v"]).drop(columns=["_k", "_v"]).reset_index(drop=True)


def first_bad(upgrades, releases=None, alerts=()) -> list[dict]:
    """Per kernel (real upgrade steps only), for each way an upgrade can hurt it: the first release
    that broke it (the bare environment, ``table.first_breaks``), made it slower (a decided ``slower``
    step) or bloated it (a compiled memory growth, or a largest batch that shrank, on the jax[tpu]
    path), each with the last good release before it and what happened; ``-`` where none did. Then
    the planted faults, each as caught (or not), so their proof is shown without mixing it in."""
    events: dict[tuple, dict[str, list[tuple]]] = {}
    real = upgrades[upgrades["kind"] == upgrade.UPGRADE]
    for (framework, impl), part in real.groupby(["framework", "impl"]):
        if not (part["state"] == upgrade.NOT_TIMED).all():
            events.setdefault((framework, impl), {})
    for r in real[real["state"] == upgrade.SLOWER].to_dict("records"):
        events.setdefault((r["framework"], r["impl"]), {}).setdefault("slowed", []).append(
            (r["after"], r["before"], f"{r['workload']} {r['ratio']:.2f}x"))
    if releases is not None:
        for b in first_breaks(upgrade_steps(releases)):
            if b.get("environment") == "bare":
                where = f"{b.get('target') or 'cpu'}: {b.get('cause')}"
                events.setdefault((b["framework"], b["impl"]), {}).setdefault("broke", []).append(
                    (str(b["first_bad"]), str(b["last_good"]), where))
    for a in alerts:
        if a["axis"] == "jax[tpu]" and a["worse"]:
            after = a["after"].split(" + ")[0].removeprefix("jax ")
            before = a["before"].split(" + ")[0].removeprefix("jax ")
            events.setdefault(("jax", a["impl"]), {}).setdefault("bloated", []).append(
                (after, before, f"{a['target']} {a['seq_len'] // 1024}k {a['figure']} "
                                f"{memory.percent(a['change'])}"))
    out = []
    for (framework, impl), kinds in sorted(events.items()):
        row = {"framework": framework, "impl": impl}
        for kind in ("broke", "slowed", "bloated"):
            found = kinds.get(kind, [])
            if not found:
                row[f"first {kind}"] = "-"
                continue
            first = min(matrix.version_key(f[0]) for f in found)
            hits = [f for f in found if matrix.version_key(f[0]) == first]
            row[f"first {kind}"] = (f"{framework} {hits[0][0]} (last good {hits[0][1]}): "
                                    + "; ".join(sorted({h[2] for h in hits})))
        out.append(row)
    for r in upgrades[upgrades["kind"] == upgrade.PLANTED].to_dict("records"):
        if r["state"] not in (upgrade.SAME, upgrade.NOT_TIMED):
            out.append({"framework": r["framework"], "impl": r["impl"], "first broke": "-",
                        "first slowed": f"planted: {r['step']}: {r['workload']} {_speed(r)}",
                        "first bloated": "-"})
    for a in alerts:
        if a["axis"] == "planted":
            out.append({"framework": "jax", "impl": a["impl"], "first broke": "-", "first slowed": "-",
                        "first bloated": f"planted: {a['alert']}"})
    return out
