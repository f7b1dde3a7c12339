"""``python -m attnbench compile-for``: compile jax attention kernels for TPUs and GPUs on any host.

    .venv-targets/bin/python -m attnbench compile-for --target tpu-v5e h200 \\
        --impl jax-xla jax-pallas-tpu-splash jax-cudnn --seq 1k 16k 64k --dtype bfloat16 \\
        --mode fwd fwd_bwd --out results/compiled-for/mine [--max-seq 128k] [--max-batch 4096]

writes ``DIR/records.csv`` (``attnbench/compiled_for/records.py``: one row per case: compiles or
not and why, fits, memory, kernel evidence, inserted copies, a roofline *model*), with
``--max-seq``, ``DIR/max_seq.csv``, and with ``--max-batch``, ``DIR/max_batch.csv`` (the records
its bisection compiled in ``DIR/max_batch_records.csv``, so that ``records.csv`` stays one batch).
Nothing runs on the target: this is what its compiler decided.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os

import attention_impls
from attnbench.compiled_for import run
from attnbench.compiled_for import targets as compile_targets
from attnbench.compiled_for.records import MAX_BATCH_COLUMNS, MAX_SEQ_COLUMNS, SUMMARY
from attnbench.compiled_for.run import parse_length
from attnbench.compiled_for.suite import MODEL_LENGTHS
from attnbench.compiled_for.targets import get_targets
from attnbench.compiled_for.worker import ENVIRONMENT
from attnbench.core import presets
from attnbench.core.workload import Workload
from attnbench.measure.process_env import scoped_environ
from attnbench.predicted import calibration
from attnbench.predicted.predict import Calibrated
from attnbench.published import shapes
from attnbench.results.table import cell, render

DEFAULT_OUT = os.path.join("results", "compiled-for", "runs")


def parse_batch(text: str) -> int:
    """A whole number of sequences, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a batch is a whole number >= 1, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"the batch bound must be >= 1, got {text!r}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("compile-for", description=__doc__,
                       help="compile jax kernels for TPU/GPU targets this host lacks (no timing)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", nargs="+", required=True,
                   help="compile targets (attnbench/compiled_for/targets.toml), e.g. tpu-v5e tpu-v6e "
                        "h200; or all")
    p.add_argument("--impl", nargs="*", help="jax implementations (default: every jax one)")
    p.add_argument("--seq", type=parse_length, nargs="+", default=None,
                   help="sequence lengths (seq_q = seq_k), e.g. 1k 16k 64k (default 1k 4k 16k 64k)")
    p.add_argument("--mode", nargs="+", default=["fwd"], choices=["fwd", "fwd_bwd"])
    p.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float16", "float32"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--workload", metavar="PRESET",
                   help="a model preset (python -m attnbench workloads): its heads, head dim, mask and batch "
                        "at each --seq (prefill and training: tokens; decode: cache keys; default the "
                        "phase's 8k/32k tokens, 32k/128k keys); --heads, --head-dim and --mode are the "
                        "preset's")
    p.add_argument("--phase", nargs="+", choices=["prefill", "training", "decode"],
                   help="the preset's phases (default: every phase it has)")
    p.add_argument("--published-shapes", action="store_true",
                   help="the aligned shapes Tokamax publishes device timings for (attnbench/published/"
                        "shapes.py: causal forward, bfloat16), each at its own batch, heads and head dim, "
                        "instead of --seq/--batch/--heads/--head-dim")
    p.add_argument("--layer", choices=["local", "global"],
                   help="a model that alternates them (Gemma-2): its windowed or its global layers")
    p.add_argument("--max-seq", type=parse_length, metavar="HI",
                   help="also bisect each implementation x target x mode x dtype for its longest feasible "
                        "length up to HI (multiples of the kernel's block), e.g. 128k")
    p.add_argument("--max-batch", type=parse_batch, metavar="HI",
                   help="also bisect each target x implementation x mode x dtype x length for its largest "
                        "batch in 1..HI whose program compiles and fits, e.g. 4096")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds per compile before its worker is killed")
    p.add_argument("--out", help=f"output folder (default {DEFAULT_OUT}/<UTC stamp>)")
    p.add_argument("--format", choices=["csv", "parquet"], default="csv")
    p.add_argument("--predict", action="store_true",
                   help="require the predicted time on every target (one line, exit 2, when a target's "
                        "family has no calibration); without it, an uncalibrated target's prediction "
                        "columns stay empty and predicted_basis says why")
    p.add_argument("--calibration", default=calibration.TABLE, metavar="PATH",
                   help=f"the time model's calibration table (default {calibration.TABLE}; make calibrate)")
    p.add_argument("--keep-hlo", action="store_true", help="also write each compiled HLO text to DIR/hlo/")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_compile_for)
    add_tune_parser(sub)


def add_tune_parser(sub) -> None:
    """``tune-targets``: every candidate tile config compiled for the targets, the kept one per case
    (``attnbench/compiled_for/tune.py``, docs/compiled-for.md#tuned-tiles-on-the-compile-targets)."""
    from attnbench.compiled_for import tune

    p = sub.add_parser("tune-targets", description=tune.__doc__,
                       help="compile every candidate tile config for TPU/GPU targets and keep the one that "
                            "fits the most tokens per chip (speed modelled, not measured)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", nargs="+", default=list(tune.DEFAULT_TARGETS),
                   help=f"compile targets (default {' '.join(tune.DEFAULT_TARGETS)})")
    p.add_argument("--impl", nargs="*",
                   help="jax kernels with tile knobs (default: per target, those written for its platform)")
    p.add_argument("--case", nargs="+", default=list(tune.DEFAULT_CASES), metavar="PRESET:PHASE:LENGTHS",
                   help="preset workloads at their real lengths (default: make headroom's: "
                        f"{' '.join(tune.DEFAULT_CASES)})")
    p.add_argument("--config", metavar="KNOB=N,...",
                   help="check one config of the one --impl against the cases instead of its search space "
                        "(compiled beside the defaults)")
    p.add_argument("--max-batch", type=int, default=4096, metavar="HI",
                   help="bisect the largest batch in 1..HI the defaults, and any candidate whose peak "
                        "could beat them, fit (0: the preset's batch only)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds per compile before its worker is killed")
    p.add_argument("--no-numerics", action="store_true",
                   help="skip the numerics check (the best-ranked candidate run in its interpreter here)")
    p.add_argument("--out", default=tune.TUNING_DIR,
                   help=f"folder of compiled-for.csv and compiled-for-kept.csv (default {tune.TUNING_DIR})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_tune_targets)


def cmd_tune_targets(args) -> int:
    """The tile tuner under the compiling environment; bad input is a ValueError (one line, exit 2)."""
    from attnbench.compiled_for import tune

    if args.max_batch < 0:
        raise ValueError(f"--max-batch must be >= 0, got {args.max_batch}")
    targets = get_targets(args.target)  # an unknown name: UnknownName naming the known ones
    cases = [tune.parse_case(c) for c in args.case]
    if args.impl:
        tune.check_impls(args.impl)
    if args.config:
        if not args.impl or len(args.impl) != 1:
            raise ValueError("--config needs exactly one --impl, the kernel whose knobs it sets")
        impl = attention_impls.get(args.impl[0])
        config = impl.search_space.check(args.config, impl.name)  # malformed or unknown knob: ValueError
        configs = {impl.name: [config]}
    else:
        configs = None
    with scoped_environ(**ENVIRONMENT):
        for platform in sorted({t.platform for t in targets}):
            problem = compile_targets.environment_problem(platform)
            if problem:
                names = ", ".join(t.name for t in targets if t.platform == platform)
                raise ValueError(f"cannot compile for {names}: {problem}")
        rows_path = os.path.join(args.out, os.path.basename(tune.ROWS_PATH))
        kept_path = os.path.join(args.out, os.path.basename(tune.KEPT_PATH))
        _, summary = tune.tune(targets, args.impl or None, cases, max_batch=args.max_batch,
                               timeout_s=args.timeout, rows_path=rows_path, kept_path=kept_path,
                               progress=not args.quiet, configs=configs, numerics=not args.no_numerics)
    columns = ["target", "impl", "workload", "phase", "seq_len", "kept_config", "max_batch",
               "tokens_per_chip", "kernel_vmem_bytes", "temp_bytes", "why"]
    print("# tuned tiles on the compile targets: compiled, not run; speed is a roofline model, not measured")
    print(render([{c: _fmt(c, r.get(c)) for c in columns} for r in summary], columns, markdown=args.markdown))
    print(f"wrote {rows_path} and {kept_path}")
    return 0


def _fmt(column: str, value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if column.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value / 1e9:.3g} GB" if value >= 1e8 else f"{value / 1e6:.3g} MB"
    if column == "model_roofline_seconds":
        return f"{value * 1e3:.3g} ms (model)"
    if column == "predicted_seconds":
        return f"{value * 1e3:.3g} ms (predicted)"
    if column.endswith("_bytes_at_max") and isinstance(value, (int, float)):
        return _fmt("_bytes", value)
    if column in ("reason", "stopped_by", "skipped") and isinstance(value, str) and value:
        return value if len(value) <= 90 else value[:87] + "..."
    return cell(value, 4)


def _grids(args) -> list[tuple[Workload, list[int], list[str]]]:
    """``[(template, lengths, modes)]``: the B1 H8 D64 shape at ``--seq``; or, with ``--workload``, each
    of the preset's phases at its lengths (``--seq``, else the phase's real ones, within its context);
    or, with ``--published-shapes``, each aligned shape at its own length."""
    if getattr(args, "published_shapes", False):
        if args.workload:
            raise ValueError("--published-shapes and --workload are two kinds of case: pass one")
        if args.dtype != [shapes.DTYPE] or args.mode != ["fwd"]:
            raise ValueError(f"--published-shapes are causal forward in {shapes.DTYPE}, as published: "
                             "leave out --dtype and --mode")
        return [(w, [w.seq_q], [w.mode]) for w in shapes.ALIGNED]
    if not args.workload:
        seqs = args.seq or [1024, 4096, 16384, 65536]
        template = Workload(batch=args.batch, q_heads=args.heads, kv_heads=args.kv_heads,
                            seq_q=seqs[0], head_dim=args.head_dim, dtype=args.dtype[0],
                            causal=args.causal, mode=args.mode[0])
        return [(template, seqs, args.mode)]
    preset = presets.get(args.workload)  # an unknown name: KeyError naming the known ones
    grids = []
    for phase in args.phase or preset.phases:
        lengths = args.seq or [n for n in MODEL_LENGTHS[phase] if n <= preset.context]
        if not lengths:
            grid = ", ".join(map(str, MODEL_LENGTHS[phase]))
            raise ValueError(f"{args.workload}'s context is {preset.context} tokens, shorter than every "
                             f"{phase} length the grid compiles ({grid}); pass --seq")
        extent = {"kv_len": lengths[0]} if phase == "decode" else {"seq": lengths[0]}
        # workload() refuses a length beyond the context, naming it
        for n in lengths:
            presets.workload(args.workload, phase, size="real", dtype=args.dtype[0], layer=args.layer,
                             **({"kv_len": n} if phase == "decode" else {"seq": n}))
        template = presets.workload(args.workload, phase, size="real", dtype=args.dtype[0], layer=args.layer,
                                    **extent)
        grids.append((template, lengths, [template.mode]))
    return grids


def cmd_compile_for(args) -> int:
    """The compile-for sweep under the compiling environment, restored for the caller afterwards."""
    with scoped_environ(**ENVIRONMENT):
        return _compile_for(args)


def _compile_for(args) -> int:
    targets = get_targets(args.target)  # an unknown name: KeyError naming the known ones
    model = Calibrated.load(args.calibration)  # a malformed table: CalibrationError (a ValueError)
    if args.predict:
        uncalibrated = [model.why_not(t) for t in targets if model.why_not(t)]
        if uncalibrated:
            raise ValueError(f"--predict: {uncalibrated[0]}")
    for platform in sorted({t.platform for t in targets}):
        problem = compile_targets.environment_problem(platform)
        if problem:
            names = ", ".join(t.name for t in targets if t.platform == platform)
            raise ValueError(f"cannot compile for {names}: {problem}")
    impls = args.impl or [n for n in attention_impls.names() if attention_impls.get(n).framework == "jax"]
    for name in impls:
        attention_impls.get(name)  # an unknown name: KeyError naming the known ones
    grids = _grids(args)  # [(template, lengths, modes)]: the B1 H8 D64 shape's, or each preset phase's
    cases = [c for template, seqs, modes in grids
             for c in run.plan(targets, impls, template, seqs, modes, args.dtype)]  # bad lengths: ValueError
    template = grids[0][0]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out or os.path.join(DEFAULT_OUT, stamp)
    path = os.path.join(out_dir, f"records.{args.format}")
    hlo_dir = os.path.join(out_dir, "hlo") if args.keep_hlo else None
    done: list[dict] = []

    def write(i, record):  # the table, rewritten atomically as each case ends
        record.update(model.columns(record, cases[i].target))
        done.append(record)
        run.write_table(done, path)

    rows = run.run_cases(cases, timeout_s=args.timeout, progress=not args.quiet, hlo_dir=hlo_dir,
                         on_record=write)
    kv = f"/{template.kv_heads}kv" if template.is_gqa else ""
    causal = " causal" if template.causal else ""
    if args.workload:
        what = f"{args.workload} ({', '.join(t.phase for t, _, _ in grids)})"
    elif args.published_shapes:
        what = "the published shapes (" + ", ".join(shapes.label(t) for t, _, _ in grids) + ")"
    else:
        what = f"B{template.batch} H{template.q_heads}{kv} D{template.head_dim}{causal}"
    print(f"# compiled for, not measured: {what}; peak and HBM per device; the roofline is a model")
    print(render([{c: _fmt(c, r.get(c)) for c in SUMMARY} for r in rows], SUMMARY, markdown=args.markdown))
    print(f"wrote {path}")
    extra = []
    if args.max_seq:
        if args.workload:
            raise ValueError("--max-seq bisects the B1 H8 D64 shape's length; a preset's lengths are "
                             "its phases'")
        summary, extra = run.max_feasible(targets, impls, template, args.mode, args.dtype, args.max_seq,
                                          known=rows, timeout_s=args.timeout, progress=not args.quiet)
        if extra:
            run.write_table(rows + extra, path)
        seq_path = os.path.join(out_dir, f"max_seq.{args.format}")
        run.write_table(summary, seq_path, MAX_SEQ_COLUMNS)
        print(render([{c: _fmt(c, r.get(c)) for c in MAX_SEQ_COLUMNS} for r in summary], MAX_SEQ_COLUMNS,
                     markdown=args.markdown))
        print(f"wrote {seq_path}")
    if args.max_batch:
        batch_path = os.path.join(out_dir, f"max_batch.{args.format}")
        records_path = os.path.join(out_dir, f"max_batch_records.{args.format}")
        summary, compiled = [], []

        def write_batches(found_so_far):  # the summary so far, rewritten atomically as each row ends
            run.write_table(summary + found_so_far, batch_path, MAX_BATCH_COLUMNS)

        for grid_template, seqs, modes in grids:
            found, extra_records = run.max_batch(
                targets, impls, grid_template, seqs, modes, args.dtype, args.max_batch, known=rows + extra,
                timeout_s=args.timeout, progress=not args.quiet, on_row=write_batches)
            summary += found
            compiled += extra_records
        run.write_table(summary, batch_path, MAX_BATCH_COLUMNS)
        if compiled:
            run.write_table(compiled, records_path)
        print(f"# largest batch in 1..{args.max_batch} that compiles and fits, per length; "
              "tokens per chip = max_batch x seq_len / chips")
        print(render([{c: _fmt(c, r.get(c)) for c in MAX_BATCH_COLUMNS} for r in summary], MAX_BATCH_COLUMNS,
                     markdown=args.markdown))
        print(f"wrote {batch_path}")
    return 0
