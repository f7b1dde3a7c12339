"""``attnbench run``: the measurement sweep outside asv, its flags, and what they may not be."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import sys

import attention_impls
from attnbench import hardware
from attnbench.asv.machine import machine_name
from attnbench.backends import here
from attnbench.core import presets, traffic
from attnbench.core.regimes import PACKED, REGIMES, regime_reason
from attnbench.core.workload import PHASE_MODES, Workload
from attnbench.hardware import get_hardware_profile, load_hardware_profiles
from attnbench.hardware.dtypes import machine_dtype_problem
from attnbench.hardware.hardware_profiles import PRICE_KINDS
from attnbench.measure.cost import check_price_kind
from attnbench.measure.engine import Case, Options
from attnbench.measure.process_env import pin_threads
from attnbench.published import shapes
from attnbench.results import tuned
from attnbench.results.table import cell, render
from attnbench.run import provenance, resume, sweep
from attnbench.run.adaptive import RoundPlan
from attnbench.run.plan import plan


def _impls(names: list[str] | None, frameworks: list[str] | None = None):
    impls = [attention_impls.get(n) for n in (names or attention_impls.names())]
    return [i for i in impls if not frameworks or i.framework in frameworks]


def _render(rows, columns, args) -> str:
    return render(rows, columns, markdown=getattr(args, "markdown", False))


def parse_bytes(text: str) -> int:
    """'8G', '512M', '1.5G' or a plain byte count."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    text = text.strip().upper().removesuffix("B")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise ValueError(f"--memory-cap must look like 8G, 512M or a byte count, got {text!r}") from None


RUN_COLUMNS = ["impl", "workload", "phase", "mask", "seq_q", "seq_k", "gqa", "regime", "label", "execution",
               "status", "seconds_per_step", "tflops",
               "mfu", "compiler_temp_bytes", "host_rss_growth_bytes", "compiles", "compile_seconds_total",
               "padding_waste", "usd_per_step_on_demand", "usd_per_step_with_compiles_on_demand"]


def cmd_run(args) -> int:
    """A sweep outside asv: every case in a killable worker, written as a tidy table."""

    threads = args.threads or len(os.sched_getaffinity(0))
    memory_cap = parse_bytes(args.memory_cap) if args.memory_cap else None
    workloads = run_workloads(args)
    template = workloads[0]
    static_only = args.workload or template.phase == "decode" or args.published_shapes
    regimes = args.regime or (["static"] if static_only else list(REGIMES))
    for workload in workloads if PACKED in regimes else ():
        reason = regime_reason(workload, PACKED)
        if reason:
            raise ValueError(f"--regime packed: {reason}")
    impls = [i.name for i in _impls(args.impl, args.framework) if not here.framework_missing(i)]
    if not impls:
        raise ValueError("no implementation of the chosen ones is installed in this environment")
    check_run_inputs(args)  # before the first case, not after the sweep
    pin_threads(threads)  # this process too, for the no-isolation path
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out or os.path.join("results", "runs", f"{stamp}-{os.uname().nodename}")
    trace_dir = os.path.join(out_dir, "traces")

    round_plan = run_round_plan(args)  # a bad budget or margin is refused before anything runs
    check_traffic(args, workloads)  # a malformed trace is refused before anything runs
    options = Options(bucket_policy=args.bucket_policy, regime_steps=args.steps,
                      min_seconds=args.min_seconds, numerics=not args.no_numerics,
                      hardware_profile=args.hardware_profile,
                      price_per_hour=args.price_per_hour, spot_price_per_hour=args.spot_price_per_hour,
                      price_kind=args.price_kind,
                      trace_dir=trace_dir, compile_cache=args.compile_cache, timer=args.timer,
                      traffic=args.traffic, stream_windows=args.windows)
    # Every case in a worker of its own: compile caches live per process.
    # A regime's case leaves the step's evidence and numerics to the static case, when it runs too.
    config = run_config(args, impls)
    cases = [Case(name, workload, dataclasses.replace(
                 options, regime=regime, step_checks=regime == "static" or "static" not in regimes),
                  config=config, config_source="given" if config else "defaults")
             for name in impls for workload in workloads for regime in regimes]
    if args.tuned:  # each tiled kernel at the config make tune kept for its workload here
        entries = tuned.read("results", machine_name())
        cases = [tuned.tuned_case(case, entries) for case in cases]
    kwargs = {"isolate": not args.no_isolate, "timeout_s": args.timeout, "memory_cap_bytes": memory_cap,
              "threads": threads}
    meta = provenance.run_metadata()
    path = os.path.join(out_dir, f"records.{args.format}")
    # --resume: attnbench/run/resume.py.

    if args.resume and not args.out:
        raise ValueError("--resume needs --out DIR: the folder of the sweep to finish")
    resume.check_args(out_dir, args, resuming=args.resume)
    kept, prior = [], {}
    if args.resume:
        kept, cases, prior = resume.split(path, cases)
        print(f"resume: {len(kept)} cases already in {path}; measuring the {len(cases) - len(prior)} missing"
              + (f", and going on with the later rounds of {len(prior)}" if prior else ""), file=sys.stderr)
    refused, admitted = plan(cases, in_process=args.no_isolate)
    # Rewritten (atomically) after every case: an interrupted sweep keeps what it measured.
    done: dict[int, dict] = dict(refused)  # by case index: a pooled record replaces its first round's

    def write(i, record):
        done[admitted[i]] = record
        resume.write_resumed(kept, [done[j] for j in sorted(done)], path, meta)

    if refused:
        resume.write_resumed(kept, [done[j] for j in sorted(done)], path, meta)
    spent: dict[str, float] = {}
    sweep.measure_cases([cases[i] for i in admitted], progress=not args.quiet, rounds=round_plan,
                        prior={n: prior[i] for n, i in enumerate(admitted) if i in prior}, spent=spent,
                        on_record=write, **kwargs)
    if not args.quiet:
        print(f"time spent: {sweep.time_spent(spent)}", file=sys.stderr)
    rows = [done[i] for i in sorted(done)]
    print(_render([{c: cell(r.get(c), 4) for c in RUN_COLUMNS} for r in rows], RUN_COLUMNS, args))
    if args.max_seq and args.resume and os.path.exists(os.path.join(out_dir, f"max_seq.{args.format}")):
        print("resume: max_seq table already there; not walking the lengths again", file=sys.stderr)
    elif args.max_seq:
        feasible = sweep.max_feasible_lengths(impls, template, args.max_seq, options, **kwargs)
        sweep.write_table(feasible, os.path.join(out_dir, f"max_seq.{args.format}"), meta)
        print(_render([{k: cell(v, 4) for k, v in r.items()} for r in feasible],
                      ["impl", "max_feasible_seq", "tried_up_to", "stopped_by"], args))
    print(f"wrote {path}")
    return 0


def run_config(args, impls: list[str]) -> tuple:
    """``--config``'s tile config, checked against the one kernel it is for; ``()`` without one."""
    if not args.config:
        return ()
    if args.tuned:
        raise ValueError("--config and --tuned exclude each other: a given config or the tuned ones")
    if len(impls) != 1:
        raise ValueError(f"--config sets one kernel's tiles: name exactly one with --impl (got {len(impls)})")
    return attention_impls.get(impls[0]).with_config(args.config).config


def run_round_plan(args):
    """The later timing rounds ``--rounds``, ``--max-rounds``, ``--budget``, ``--margin``,
    ``--precision`` and ``--round-seconds`` ask for (None: one window per case); ``ValueError``
    naming a bad one."""
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1 (the first window), got {args.rounds}")
    if args.budget is not None and not args.budget > 0:
        raise ValueError(f"--budget must be more than 0 seconds, got {args.budget:g}")
    if not 0 < args.margin < 1:
        raise ValueError(f"--margin must be a fraction between 0 and 1 (0.1 for +-10%), got {args.margin:g}")
    if args.precision is not None and not 0 < args.precision < 1:
        raise ValueError(f"--precision must be a fraction between 0 and 1 (0.05 for +-5%), "
                         f"got {args.precision:g}")
    most = args.max_rounds or args.rounds
    if most < args.rounds:
        raise ValueError(f"--max-rounds ({most}) must be at least --rounds ({args.rounds})")
    if most < 2:
        return None
    return RoundPlan(min_rounds=args.rounds - 1, max_rounds=most - 1, budget_s=args.budget,
                     margin=args.margin, precision=args.precision, window_s=args.round_seconds)


def check_traffic(args, workloads: list[Workload]) -> None:
    """``--traffic`` read and checked: ``TraceError`` (exit 2) naming the file and line of a malformed
    row, or of a request longer than the preset model's context."""
    if args.windows < 1:
        raise ValueError(f"--windows must be at least 1, got {args.windows}")
    if not traffic.is_trace(args.traffic):
        return
    trace = traffic.load(args.traffic)
    for workload in workloads:
        if workload.phase == "decode" and trace.generated is None:
            raise traffic.TraceError(trace.path, 1, "a decode stream needs a GeneratedTokens column")
        if args.workload:
            traffic.check_context(trace, presets.get(args.workload).context, workload.phase)


def run_workloads(args) -> list[Workload]:
    """The workloads ``run`` measures: a preset's or the custom template's, one per ``--seq`` (or
    ``--kv-len``); bad combinations raise ``ValueError`` naming the valid choices."""
    if getattr(args, "published_shapes", False):
        given = [name for name, value in (("--workload", args.workload), ("--seq", args.seq),
                                          ("--kv-len", args.kv_len), ("--batch", args.batch),
                                          ("--heads", args.heads), ("--kv-heads", args.kv_heads),
                                          ("--head-dim", args.head_dim), ("--window", args.window),
                                          ("--softcap", args.softcap), ("--documents", args.documents))
                 if value is not None]
        if given or args.dtype != shapes.DTYPE or args.mode != "fwd" or not args.causal:
            raise ValueError(f"--published-shapes are the aligned shapes, causal forward in {shapes.DTYPE}, "
                             f"as published: drop {', '.join(given) or '--dtype/--mode/--no-causal'}")
        return list(shapes.ALIGNED)
    if args.softcap is not None and args.softcap <= 0:
        raise ValueError(f"--softcap must be a positive number, got {args.softcap}")
    if args.window is not None and not args.causal:
        raise ValueError("--window needs a causal mask (drop --no-causal): a sliding window is the last W "
                         "keys up to the query's own position")
    if args.workload:
        phase = args.phase or "prefill"
        preset = presets.get(args.workload)
        if args.mode != "fwd" or any(x is not None for x in (args.heads, args.kv_heads, args.head_dim)):
            raise ValueError(f"--workload {args.workload} fixes the heads and the mode (use --phase); drop "
                             "--heads/--kv-heads/--head-dim/--mode")
        if args.window is not None and not preset.causal:
            raise ValueError(f"--window needs a causal mask; {args.workload} is bidirectional")
        common = {"batch": args.batch, "window": args.window, "softcap": args.softcap,
                  "documents": args.documents, "layer": args.layer, "dtype": args.dtype, "size": args.size}
        if phase == "decode":
            return [presets.workload(args.workload, phase, seq=(args.seq or [None])[0], kv_len=kv, **common)
                    for kv in (args.kv_len or [None])]
        if args.kv_len:
            raise ValueError(f"--kv-len is decode's cache length; --phase {phase} runs seq x seq (use --seq)")
        return [presets.workload(args.workload, phase, seq=seq, **common) for seq in (args.seq or [None])]
    if args.layer is not None or args.size != "real":
        raise ValueError("--layer and --size pick a preset's layer and lengths: they need --workload NAME")
    phase = args.phase or ("training" if args.mode == "fwd_bwd" else "prefill")
    mode = PHASE_MODES[phase]
    base = dict(batch=args.batch or 1, q_heads=args.heads or 8, kv_heads=args.kv_heads,
                head_dim=args.head_dim or 64, dtype=args.dtype, causal=args.causal, mode=mode,
                window=args.window, softcap=args.softcap, documents=args.documents)
    if phase == "decode":
        if not args.kv_len:
            raise ValueError("--phase decode needs --kv-len N (the KV cache's length)")
        queries = (args.seq or [1])[0]
        bad = [kv for kv in args.kv_len if queries > kv]
        if bad:
            raise ValueError(f"decode runs seq={queries} new tokens against kv_len={bad[0]}: seq must not "
                             "exceed kv_len")
        return [Workload(seq_q=queries, seq_k=kv, ragged=base["batch"] > 1, **base) for kv in args.kv_len]
    if args.kv_len:
        raise ValueError(f"--kv-len is decode's cache length; --phase {phase} runs seq x seq (use --seq)")
    return [Workload(seq_q=seq, seq_k=seq, **base) for seq in (args.seq or [256, 512, 1024])]


def check_run_inputs(args) -> None:
    """Refuse, naming the valid choices, a hardware profile that does not exist, a price without
    what it buys (``measure.cost.check_price_kind``) or a dtype this machine's accelerator cannot run
    (``hardware.dtypes.machine_dtype_problem``)."""
    hardware_profile, dtype = args.hardware_profile, args.dtype
    check_price_kind(args.price_per_hour, args.spot_price_per_hour, args.price_kind)
    if hardware_profile:
        try:
            get_hardware_profile(hardware_profile)
        except KeyError:
            raise ValueError(f"--hardware-profile {hardware_profile!r} is not a hardware profile; choose one "
                             f"of {', '.join(load_hardware_profiles())}") from None
    attached = hardware.accelerator_present()
    problem = machine_dtype_problem(attached.platform if attached else "cpu", dtype)
    if problem:
        raise ValueError(f"--dtype {dtype}: {problem}")



def add_run_command(sub) -> None:
    """The measurement sweep outside asv."""
    p = sub.add_parser("run", help="measurement sweep (timing, memory, regimes, numerics, cost) to a table")
    p.add_argument("--impl", nargs="*", help="only these implementations")
    p.add_argument("--framework", nargs="*", help="only these frameworks (numpy, jax, torch, torch_xla)")
    p.add_argument("--workload", help="a model preset (python -m attnbench workloads): its heads, head dim "
                   "and mask; the options below override it")
    p.add_argument("--published-shapes", action="store_true",
                   help="the five shapes Tokamax publishes chip timings for (attnbench/published/shapes.py; "
                        "with --dtype bfloat16): measured beside the published figure on the same chip")
    p.add_argument("--phase", choices=("prefill", "training", "decode"),
                   help="prefill (forward), training (forward + backward), decode (queries vs a KV cache)")
    p.add_argument("--seq", type=int, nargs="+", help="max length per case (decode: new query tokens, "
                   "default 1); default 256 512 1024, or the preset's")
    p.add_argument("--kv-len", type=int, nargs="+", help="decode: the KV cache's length per case")
    p.add_argument("--window", type=int, help="sliding window of W keys (causal only)")
    p.add_argument("--softcap", type=float, help="logit soft cap C: C * tanh(score / C) before the mask")
    p.add_argument("--documents", type=int,
                   help="documents packed per sequence (segment ids; seeded lengths)")
    p.add_argument("--layer", choices=presets.LAYERS,
                   help="a preset that alternates local (windowed) and global layers (gemma-2-9b): which "
                   "one (default local)")
    p.add_argument("--size", choices=("real", "default"), default="real",
                   help="a preset's lengths: the model's own (real) or the 2-core CPU suite's (default)")
    p.add_argument("--regime", nargs="+", choices=list(REGIMES),
                   help="shape regimes (default all four; static only for a preset or decode; "
                        "decode's streams vary its cache length; packed lays a stream's requests end to "
                        "end with segment ids, for prefill and training)")
    p.add_argument("--bucket-policy", default="multiple-128", help="multiple-N or pow2")
    p.add_argument("--steps", type=int, default=8, help="steps in each regime's length stream")
    p.add_argument("--traffic", default="uniform", metavar="TRACE",
                   help="where the streams' lengths come from: azure-conv or azure-code (the Azure LLM "
                        "inference traces, shipped), a CSV of your own (ContextTokens or length, optionally "
                        "GeneratedTokens and TIMESTAMP; docs/workloads.md), or uniform (the synthetic "
                        "baseline, default)")
    p.add_argument("--windows", type=int, default=8,
                   help="trace windows a stream is taken from, evenly over the trace (default 8)")
    p.add_argument("--batch", type=int, help="sequences per step (default 1; a preset's decode: its own)")
    p.add_argument("--heads", type=int, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, help="default 64")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--mode", default="fwd", choices=["fwd", "fwd_bwd"])
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--min-seconds", type=float, default=0.3, help="steady-state timing budget per case")
    p.add_argument("--rounds", type=int, default=1,
                   help="timing rounds of every static case, its first window included; the later ones "
                        "paired by comparison group in warm workers and pooled (default 1)")
    p.add_argument("--max-rounds", type=int,
                   help="more rounds, up to this many, for the kernels of a forced / native pair neither "
                        "decided nor equal within --margin, or a figure wider than --precision "
                        "(default: --rounds)")
    p.add_argument("--budget", type=float, help="seconds the later rounds may take in all (default: none)")
    p.add_argument("--margin", type=float, default=0.10,
                   help="two kernels equal within +-margin settle a pair (default 0.10)")
    p.add_argument("--precision", type=float,
                   help="a static step's rounds go on, up to --max-rounds or --budget, until its 99%% "
                        "interval is within +-precision of its median (0.05: 5%%; default: off)")
    p.add_argument("--round-seconds", type=float, default=0.1, help="each case's window per later round")
    p.add_argument("--timer", choices=("wall", "cuda-events", "xla-device-events", "device"), default="wall",
                   help="static timing: wall clock around blocking calls (every backend); CUDA events "
                        "around each call's launch, L2 flushed first (torch on a CUDA GPU, as do_bench); "
                        "the profiler's device events of a few calls, L2 flushed before each (jax on a "
                        "GPU or TPU); device: the device's own clock where the backend has one, else wall")
    p.add_argument("--compile-cache", choices=("cold", "warm"), default="cold",
                   help="cold (default): each case compiles with empty on-disk compiler caches; "
                        "warm: with whatever torch Inductor's / jax's caches already hold")
    p.add_argument("--threads", type=int, help="CPU threads to pin (default: the cores this process may use)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it is killed")
    p.add_argument("--memory-cap", help="address-space cap per worker, e.g. 8G (hits become status oom)")
    p.add_argument("--max-seq", type=int, nargs="*", help="also find the largest feasible length among these")
    p.add_argument("--hardware-profile", help="hardware profile name "
                   "(see attnbench/hardware/hardware_profiles.toml)")
    p.add_argument("--profile", dest="hardware_profile", help=argparse.SUPPRESS)  # deprecated alias
    p.add_argument("--price-per-hour", type=float, help="USD per hour for the device, overriding the profile")
    p.add_argument("--spot-price-per-hour", type=float)
    p.add_argument("--price-kind", choices=PRICE_KINDS,
                   help="what --price-per-hour and --spot-price-per-hour buy: instance (the accelerator "
                        "with its host VM) or accelerator (the chip alone); required with them")
    p.add_argument("--config", help="the tile config of the one --impl kernel, e.g. block_q=64,block_k=256 "
                   "(its knobs: its file's search_space; docs/tuning.md)")
    p.add_argument("--tuned", action="store_true", help="each tiled kernel at the config `make tune` kept "
                   "for its workload on this machine (results/tuning/<machine>.tuning)")
    p.add_argument("--no-numerics", action="store_true", help="skip the float64 reference check")
    p.add_argument("--no-isolate", action="store_true", help="measure in this process (no timeout/cap)")
    p.add_argument("--out", help="output folder (default results/runs/<UTC stamp>-<host>)")
    p.add_argument("--resume", action="store_true",
                   help="finish the sweep in --out: measure only the cases missing from its records, "
                        "keeping the rows there unchanged (attnbench/run/resume.py)")
    p.add_argument("--format", choices=["csv", "parquet"], default="csv")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_run)
