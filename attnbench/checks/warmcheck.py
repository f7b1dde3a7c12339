"""``attnbench warmcheck``: do warm round workers bias the figures? A benchmark of the harness itself.

The later timing rounds keep every case's step built in a worker that has run other cases before
(``measure/round_timing.py``). This times each case both ways, interleaved: in every round, once in a
fresh process that builds only that case (and warms it with one call), and once in a long-lived worker
that holds every case's step and has just timed the others. The per-round ratio warm / fresh, its
median and 99% interval (``core.stats.paired_ratio``), says whether the warm worker moves a figure:
it should be equal within the margin. Run it alone on the machine (results/LOG.md).
"""

from __future__ import annotations

import argparse
import sys

from attnbench.core.stats import paired_ratio
from attnbench.core.workload import Workload
from attnbench.measure.engine import Case, Options
from attnbench.measure.round_timing import time_round
from attnbench.run.plan import preload
from attnbench.run.worker import Worker

DEFAULT_CASES = ("jax-xla:1024", "jax-blockwise-flash:256", "torch-sdpa-flash:1024",
                 "torch-blockwise-flash:256")
TIMEOUT_S = 600.0


def check(cases: list[Case], *, rounds: int, window_s: float, margin: float, progress=print) -> list[dict]:
    """Per case: warm / fresh over ``rounds`` interleaved rounds, with its 99% interval and answer."""
    frameworks = tuple(sorted({f for case in cases for f in preload(case.impl)}))
    warm = Worker(time_round, threads=None)
    medians = {case.key: {"warm": [], "fresh": []} for case in cases}
    try:
        for r in range(rounds + 1):  # round 0 builds the warm worker's steps; it is discarded
            for n, case in enumerate(cases):
                order = ("fresh", "warm") if (r + n) % 2 == 0 else ("warm", "fresh")
                got = {}
                for way in order:
                    if way == "warm":
                        answer, failure = warm.call(([(case, 1)], window_s), TIMEOUT_S, preload=frameworks)
                    else:
                        with Worker(time_round) as fresh:
                            answer, failure = fresh.call(([(case, 1)], window_s), TIMEOUT_S,
                                                         preload=frameworks)
                    if failure is not None or answer[0]["status"] != "ok":
                        raise RuntimeError(f"{case.key}: {failure or answer[0]['reason']}")
                    got[way] = answer[0]["median_s"]
                if r:
                    for way, value in got.items():
                        medians[case.key][way].append(value)
    finally:
        warm.close()
    rows = []
    for case in cases:
        ratio = paired_ratio(medians[case.key]["warm"], medians[case.key]["fresh"])
        state = ratio.against_one(margin)
        rows.append({"case": f"{case.impl} {case.workload.describe()}", "warm / fresh": ratio.ratio,
                     "low": ratio.low, "high": ratio.high, "rounds": ratio.rounds, "answer": state})
        progress(f"{rows[-1]['case']}: warm / fresh {ratio.ratio:.3f} [{ratio.low:.3f}-{ratio.high:.3f}] "
                 f"(99%, {ratio.rounds} rounds): {state}"
                 + (f" within ±{margin:.0%}" if state == "equal" else ""))
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", nargs="+", default=list(DEFAULT_CASES), help="IMPL:SEQ (causal B1 H8 D64 fwd)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--round-seconds", type=float, default=0.05)
    p.add_argument("--margin", type=float, default=0.05)


def command(args) -> int:
    if args.rounds < 8:
        raise ValueError(f"--rounds must be at least 8 (a 99% interval needs 8), got {args.rounds}")
    cases = []
    for spec in args.case:
        impl, _, seq = spec.partition(":")
        if not seq.isdigit():
            raise ValueError(f"--case takes IMPL:SEQ, got {spec!r}")
        workload = Workload(batch=1, q_heads=8, head_dim=64, seq_q=int(seq), causal=True)
        cases.append(Case(impl, workload, Options()))
    rows = check(cases, rounds=args.rounds, window_s=args.round_seconds, margin=args.margin)
    return 0 if all(r["answer"] == "equal" for r in rows) else 1


def main(argv: list[str] | None = None) -> int:  # pragma: no cover
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return command(p.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
