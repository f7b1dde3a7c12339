"""Compile one case for one target, in this process, and read what the compiler decided.

The target exists only as a topology (``jax.experimental.topologies``); inputs are abstract
``jax.ShapeDtypeStruct``s on its devices, so nothing is allocated or run, while
``jit(...).lower(...).compile()`` is the target's real compiler. Inside ``compiling_for`` the kernel
is traced as on its own hardware. On a multi-device target the heads are sharded over a 1-D mesh
under ``shard_map``, as a data-parallel-over-heads deployment would run it. The step is the
measured suite's (``jax_steps``), segment ids traced arguments as they would be on the target.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np

import attention_impls
from attention_impls._compile_target import compiling_for
from attention_impls.base import default_scale, static_mask
from attnbench.backends import jax_steps
from attnbench.compiled_for import classify, hlo, hlo_cost
from attnbench.compiled_for.records import new_record
from attnbench.compiled_for.roofline import roofline, roofline_bytes
from attnbench.compiled_for.targets import Target, gpu_target_config, library_versions, load_targets
from attnbench.core.atomic import atomic_write_text
from attnbench.core.workload import CUSTOM, Workload

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

_TOPOLOGIES: dict[str, tuple] = {}
_VERSIONS: dict | None = None


def target_devices(target: Target):
    """``(devices, mesh or None)`` of ``target``'s topology (cached per process)."""
    if target.name not in _TOPOLOGIES:
        from jax.experimental import topologies

        if target.platform == "tpu":
            kwargs = {"chips_per_host_bounds": [1, 1, 1]} if target.single_host else {}
            topo = topologies.get_topology_desc(target.topology, "tpu", **kwargs)
        else:
            topo = topologies.get_topology_desc(platform="cuda", target_config=gpu_target_config(target),
                                                topology="1x1x1")
        devices = list(topo.devices)
        mesh = None
        if len(devices) > 1:  # a plain 1-D mesh: topologies.make_mesh refuses a v4's per-core devices
            from jax.sharding import Mesh

            mesh = Mesh(np.array(devices), ("heads",))
        _TOPOLOGIES[target.name] = (devices, mesh)
    return _TOPOLOGIES[target.name]


# torch on a TPU without a chip (torch-tpu 0.2.0, tried here: docs/compiled-for.md#torch-on-a-tpu).
TORCH_ON_TPU = (
    "torch reaches a TPU through torch_xla or TorchTPU (torch-tpu 0.2.0), and neither compiles without a "
    "chip: torch-tpu's torch.compile(backend='tpu') and its export need a live PjRt client "
    "('RuntimeError: failed to retrieve the PjRt client: TPU initialization failed: No jellyfish device "
    "found.', at _internal/export/export.py fx_to_mlir), and it has no deviceless or topology compile")


def support_reason(impl, workload: Workload, target: Target, devices: int) -> str | None:
    """Why ``impl`` cannot express ``workload`` on ``target`` (call inside ``compiling_for``)."""
    if impl.framework == "torch" and target.platform == "tpu":
        return TORCH_ON_TPU
    if impl.framework != "jax":
        return (f"the compiled-for tier compiles jax programs only ({impl.name} is {impl.framework}; "
                "torch_xla: see docs/compiled-for.md)")
    support = impl.platform_support[target.platform]
    if support.status == "unsupported":
        return support.note
    missing = impl.api_missing()  # a Pallas op this jax release lacks, or cannot import here
    if missing:
        return missing
    refused = impl.feature_reason(workload)  # a mask feature (window, softcap, segment ids) it lacks
    if refused:
        return refused
    if devices > 1:
        if workload.q_heads % devices or workload.kv_heads % devices:
            return (f"heads are sharded over the target's {devices} devices: {workload.q_heads} query and "
                    f"{workload.kv_heads} kv heads do not divide evenly")
        shard = workload.replace(q_heads=workload.q_heads // devices, kv_heads=workload.kv_heads // devices)
        reason = impl.shape_reason(shard, target.platform)
        return f"per device ({shard.q_heads} heads): {reason}" if reason else None
    return impl.shape_reason(workload, target.platform)


def _program(impl, workload: Workload, devices, mesh):
    """The jitted step and its abstract arguments (q, k, v[, dO], segment ids), on the target's devices."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding


    dtype = jnp.dtype(workload.dtype)
    scale, static = default_scale(workload.head_dim, None), static_mask(workload)
    segments = workload.segment_ids() or ()
    if mesh is None:
        sharding = ids_sharding = SingleDeviceSharding(devices[0])
    else:
        spec, ids_spec = PartitionSpec(None, None, "heads", None), PartitionSpec(None, None)
        sharding, ids_sharding = NamedSharding(mesh, spec), NamedSharding(mesh, ids_spec)  # ids replicated
    q = jax.ShapeDtypeStruct(workload.q_shape, dtype, sharding=sharding)
    kv = jax.ShapeDtypeStruct(workload.kv_shape, dtype, sharding=sharding)
    ids = tuple(jax.ShapeDtypeStruct(s.shape, jnp.int32, sharding=ids_sharding) for s in segments)
    fwd = workload.mode == "fwd"
    if mesh is None:
        make = jax_steps.forward if fwd else jax_steps.forward_backward
        step = make(impl, workload.causal, scale, static)
        return step, ((q, kv, kv) if fwd else (q, kv, kv, q)) + ids
    # Several devices: the forward under shard_map; the backward is the vjp of that sharded forward.
    sharded = jax.jit(jax.shard_map(jax_steps.forward(impl, workload.causal, scale, static), mesh=mesh,
                                    in_specs=(spec,) * 3 + (ids_spec,) * len(ids), out_specs=spec,
                                    check_vma=False))
    if fwd:
        return sharded, (q, kv, kv) + ids

    def fwd_bwd(q, k, v, do, *segment_ids):
        out, vjp = jax.vjp(lambda q, k, v: sharded(q, k, v, *segment_ids), q, k, v)
        return out, vjp(do)

    return jax.jit(fwd_bwd), (q, kv, kv, q) + ids


def _versions() -> dict:
    global _VERSIONS
    if _VERSIONS is None:
        v = library_versions()
        _VERSIONS = {"jax": v["jax"], "jaxlib": v["jaxlib"], "libtpu": v["libtpu"],
                     "jax_cuda12_plugin": v["jax-cuda12-plugin"], "cudnn": v["nvidia-cudnn-cu12"],
                     "cuda_nvcc": v["nvidia-cuda-nvcc-cu12"]}
    return _VERSIONS


def _cost(compiled) -> dict | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - "GetCostAnalysis is not supported" on some backends
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return dict(cost) if cost else None


def _positive(value):
    return None if value is None or value < 0 else value  # -1: "unknown" in XLA's cost analysis


def compile_case(target: Target | str, impl_name: str, workload: Workload,
                 hlo_dir: str | None = None, config=()) -> dict:
    """One record of compiling ``impl_name`` for ``target``; a refusal is a record, not an exception.
    ``config``: the kernel's tile knobs (``AttentionImpl.with_config``; ``()``: its defaults)."""
    import jax


    if isinstance(target, str):
        target = load_targets()[target]
    record = new_record(target, impl_name, workload, **_versions())
    impl = attention_impls.get(impl_name).with_config(config)
    support = impl.platform_support[target.platform].status
    record.update(framework=impl.framework, label=impl.label(target.platform),
                  execution={"interpret-only": "interpret", "runs": "compiled"}.get(support))
    try:
        devices, mesh = target_devices(target)
    except Exception as exc:  # noqa: BLE001 - a topology libtpu/the plugin refuses
        record.update(status=classify.ERROR, reason=f"topology {target.describe()}: "
                      f"{type(exc).__name__}: {classify.first_lines(str(exc))}")
        return record
    per_chip = max(1, len(devices) // target.chips)
    chip_hbm = target.chip_hbm_bytes
    record.update(devices=len(devices), hbm_bytes=chip_hbm // per_chip if chip_hbm else None)
    with compiling_for(target.platform, name=target.name, compute_capability=target.compute_capability):
        reason = support_reason(impl, workload, target, len(devices))
        if reason:
            record.update(status=classify.UNSUPPORTED, reason=reason)
            return record
        hook = getattr(impl, "trace_context", None)
        context = hook(target.platform) if hook else contextlib.nullcontext()
        try:
            # jax's default device is the host CPU here; only kernels whose lowering asks it which TPU
            # it is switch to the target's device (splash builds its masks eagerly on the default one).
            on_target = jax.default_device(devices[0]) if getattr(impl, "lowers_on_target_device", False) \
                else contextlib.nullcontext()
            with context, on_target:
                fn, args = _program(impl, workload, devices, mesh)
                start = time.perf_counter()
                lowered = fn.lower(*args)
                record["lower_seconds"] = time.perf_counter() - start
                start = time.perf_counter()
                compiled = lowered.compile()
                record["compile_seconds"] = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - the compiler's refusal is the result
            if record["lower_seconds"] is not None and record["compile_seconds"] is None:
                record["compile_seconds"] = time.perf_counter() - start  # how long until it refused
            message = str(exc)
            status, why = classify.classify_compile_error(message, type(exc).__name__)
            record.update(status=status, reason=why, fits=classify.fits(None, None, status),
                          compiler_hbm_bytes=classify.compiler_hbm_bytes(message),
                          compiler_required_bytes=classify.compiler_required_bytes(message))
            return record
    record["status"] = classify.OK
    _read_compiled(record, compiled, target, workload, per_chip, hlo_dir)
    return record


def _read_compiled(record: dict, compiled, target: Target, workload: Workload, per_chip: int,
                   hlo_dir: str | None) -> None:
    memory = compiled.memory_analysis()
    for column, attr in (("argument_bytes", "argument_size_in_bytes"),
                         ("output_bytes", "output_size_in_bytes"), ("temp_bytes", "temp_size_in_bytes"),
                         ("alias_bytes", "alias_size_in_bytes"), ("peak_bytes", "peak_memory_in_bytes"),
                         ("generated_code_bytes", "generated_code_size_in_bytes")):
        value = getattr(memory, attr, None)
        record[column] = int(value) if value is not None else None
    record["fits"] = classify.fits(record["peak_bytes"], record["hbm_bytes"])

    text = compiled.as_text() or ""
    if hlo_dir:

        preset = "" if workload.name == CUSTOM else f"{workload.name}-{workload.phase}-"
        seq = workload.seq_q if workload.seq_q == workload.seq_k else f"{workload.seq_q}x{workload.seq_k}"
        name = f"{target.name}-{record['impl']}-{preset}{seq}-{workload.mode}-{workload.dtype}.hlo.txt"
        atomic_write_text(os.path.join(hlo_dir, name), text)
    module = hlo.parse_module(text)
    calls = hlo.kernel_calls(hlo.custom_calls(module))
    copies = hlo.inserted_copies(module)
    record.update(kernel_evidence=hlo.kernel_evidence(module, interpret=record["execution"] == "interpret"),
                  library_config=hlo.tokamax_configs(text) or None,
                  custom_calls=", ".join(sorted({c.target for c in calls})) or "none",
                  fusions=hlo.fusion_counts(module)[0], inserted_copies=len(copies),
                  inserted_copy_bytes=sum(c.bytes for c in copies),
                  inserted_copy_detail=hlo.describe_copies(copies))

    cost = _cost(compiled)
    if cost is None:
        record["compiler_flops_source"] = (f"none: the {target.platform.upper()} compiler gives no "
                                           "cost analysis")
    else:
        record.update(compiler_flops=_positive(cost.get("flops")),
                      compiler_bytes_accessed=_positive(cost.get("bytes accessed")),
                      model_compiler_seconds=_positive(cost.get("optimal_seconds")),
                      compiler_flops_source=hlo.flops_source(module))

    profile = target.profile
    peak = profile.peak(workload.dtype)
    price = profile.price_on_demand
    min_bytes_per_chip = workload.min_bytes / target.chips
    bytes_per_chip, source = roofline_bytes(record["compiler_bytes_accessed"], per_chip, min_bytes_per_chip)
    model = roofline(flops_per_chip=workload.flops / target.chips, bytes_per_chip=bytes_per_chip,
                     peak_tflops=peak.value if peak else None,
                     hbm_tb_s=profile.hbm_tb_s.value if profile.hbm_tb_s else None,
                     price_per_chip_hour=price.value if price else None, chips=target.chips)
    record.update(_program_cost(module, target, workload, peak, per_chip))
    record.update(roofline_bytes=bytes_per_chip, roofline_bytes_source=source,
                  peak_tflops=peak.value if peak else None,
                  hbm_tb_s=profile.hbm_tb_s.value if profile.hbm_tb_s else None,
                  price_per_chip_hour=price.value if price else None,
                  price_kind=profile.price_kind if price else None, **model.as_record())


def _program_cost(module, target: Target, workload: Workload, peak, per_chip: int) -> dict:
    """The ``hlo_`` columns: each op of one device's program at one device's share of the chip's peaks.
    A dtype without a peak in the profile (float16: the profiles hold bfloat16's) is costed at
    bfloat16's, and says so."""
    profile = target.profile
    notes = []
    if peak is None and profile.peak("bfloat16") is not None:
        peak = profile.peak("bfloat16")
        notes.append(f"no {workload.dtype} peak in profile {target.hardware_profile}: bfloat16's used")
    devices = per_chip * target.chips
    cost = hlo_cost.program_cost(
        module, peak_flops=peak.value * 1e12 / per_chip if peak else None,
        bandwidth=profile.hbm_tb_s.value * 1e12 / per_chip if profile.hbm_tb_s else None,
        silent_kernel_flops=workload.flops / devices)
    cost.notes[:0] = notes
    return cost.as_record()
