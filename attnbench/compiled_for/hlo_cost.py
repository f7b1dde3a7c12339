"""What each op of the compiled program costs at the chip's peaks: FLOPs, bytes moved, and a time each.

Walks the optimized HLO from its entry computation, op by op, as the chip would run it:

- a **fusion** or a bare op reads its operands and writes its result in HBM; its FLOPs are its dots'
  and convolutions' (``2 x output elements x contracted size``; the MXU's and tensor cores' work;
  element-wise work is left to the memory side). A fusion that only slices an operand
  (``dynamic-slice`` inside a loop) reads the slice, and one whose root is a ``dynamic-update-slice``
  writes the update, not the whole buffer;
- a **while loop** costs its body times its trip count: XLA:GPU records it
  (``known_trip_count``); libtpu's text does not, so it is read from the loop's condition
  (``counter < constant``, counting from a constant start). A loop whose count cannot be read counts
  once, and ``notes`` says so;
- a **kernel** (a custom call: Mosaic, Triton, cuDNN) costs its declared ``cost_estimate``; a kernel
  that declares none costs ``silent_kernel_flops`` (the step's FLOPs, shared among such calls) and
  the bytes of its operands and results;
- parameters, constants, tuples, bitcasts and asynchronous copies cost nothing and launch nothing.

Each op's time is ``max(FLOPs / peak, bytes / bandwidth)``; the sums are kept per kind of op
(``kernel``, ``matmul``: an XLA op with a dot, ``other``), with the number of launches: the
prediction model (``attnbench.predicted``) weighs them. This reads text only: no framework.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

from attnbench.compiled_for import hlo

KINDS = ("kernel", "matmul", "other")
FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy-start", "copy-done",
        "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
        "async-done", "send-done", "recv-done", "all-reduce-done", "all-gather-done",
        "collective-permute-done"}
SLICING = {"dynamic-slice", "slice", "gather"}


@dataclass
class KindCost:
    flops: float = 0.0
    bytes: float = 0.0
    seconds: float = 0.0  # sum of each op's max(compute, memory)
    compute_seconds: float = 0.0  # of the ops whose compute side is the larger
    memory_seconds: float = 0.0  # of the ops whose memory side is the larger
    launches: float = 0.0


@dataclass
class ProgramCost:
    kinds: dict[str, KindCost] = field(default_factory=lambda: {k: KindCost() for k in KINDS})
    notes: list[str] = field(default_factory=list)

    def total(self, name: str) -> float:
        """One ``KindCost`` field summed over the kinds."""
        return sum(getattr(k, name) for k in self.kinds.values())

    def add(self, other: ProgramCost) -> None:
        """``other``'s costs and notes added to these, kind by kind."""
        for kind, cost in other.kinds.items():
            mine = self.kinds[kind]
            for f in fields(KindCost):
                setattr(mine, f.name, getattr(mine, f.name) + getattr(cost, f.name))
        self.notes.extend(other.notes)

    def as_record(self) -> dict:
        """The ``hlo_`` columns of a compiled-for record."""
        out = {f"hlo_{name}": self.total(name) for name in ("flops", "bytes", "launches")}
        for kind, cost in self.kinds.items():
            out[f"hlo_{kind}_seconds"] = cost.seconds
        out["hlo_compute_bound_seconds"] = self.total("compute_seconds")
        out["hlo_memory_bound_seconds"] = self.total("memory_seconds")
        out["hlo_cost_notes"] = "; ".join(dict.fromkeys(self.notes)) or None
        return out


def _int_list(attrs: str, key: str) -> list[int]:
    found = re.search(rf"\b{re.escape(key)}=\{{([\d,\s]*)\}}", attrs)
    return [int(x) for x in found.group(1).split(",") if x.strip()] if found else []


def dot_flops(instr: hlo.Instruction, comp: hlo.Computation) -> float:
    """``2 x output elements x contracted size`` of a ``dot`` or ``convolution``."""
    out = math.prod(instr.dims)
    operands = [comp.instructions.get(n) for n in instr.operands]
    if instr.opcode == "dot":
        lhs = operands[0] if operands else None
        contracting = _int_list(instr.attrs, "lhs_contracting_dims")
        dims = lhs.dims if lhs is not None else []
        size = math.prod(dims[d] for d in contracting if d < len(dims)) if contracting else 1
        return 2.0 * out * size
    # convolution: the kernel's input-feature dimension ("i" of dim_labels' rhs) times the window taps
    # that meet real data (a dilated lhs leaves only ceil(size / dilation) taps per spatial dimension).
    labels = re.search(r"dim_labels=\w+_(\w+)->", instr.attrs)
    rhs = operands[1] if len(operands) > 1 else None
    size = 1
    if labels and rhs is not None:
        rhs_dims = rhs.dims
        position = labels.group(1).find("i")
        if 0 <= position < len(rhs_dims):
            size = rhs_dims[position]
    window = re.search(r"window=\{([^}]*)\}", instr.attrs)
    if window:
        sizes = re.search(r"size=([\dx]+)", window.group(1))
        dilate = re.search(r"lhs_dilate=([\dx]+)", window.group(1))
        taps = [int(s) for s in sizes.group(1).split("x")] if sizes else []
        dil = [int(s) for s in dilate.group(1).split("x")] if dilate else [1] * len(taps)
        size *= math.prod(math.ceil(t / d) for t, d in zip(taps, dil, strict=False))
    return 2.0 * out * size


def _body_flops(body: hlo.Computation, module: hlo.Module) -> float:
    total = 0.0
    for instr in body.instructions.values():
        if instr.opcode in ("dot", "convolution"):
            total += dot_flops(instr, body)
        elif instr.opcode == "fusion" and instr.calls in module.computations:
            total += _body_flops(module.computations[instr.calls], module)
    return total


def _fusion_bytes(instr: hlo.Instruction, comp: hlo.Computation, module: hlo.Module) -> float:
    """Bytes a fusion reads and writes in HBM: a parameter only sliced inside reads its slices; a
    root ``dynamic-update-slice`` writes its update into the buffer it was given, in place."""
    body = module.computations.get(instr.calls or "")
    operand_bytes = [_operand_bytes(name, comp) for name in instr.operands]
    if body is None:
        return _io_bytes(instr, comp)
    users = body.users()
    params = {}
    for node in body.instructions.values():
        if node.opcode == "parameter":
            index = node.integer_argument
            if index is not None:
                params[index] = node
    root = body.root
    in_place = set()
    written = instr.bytes
    if root is not None and root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
        update = body.instructions.get(root.operands[1])
        written = update.bytes if update is not None else written
        in_place.add(root.operands[0])
    read = 0.0
    for index, size in enumerate(operand_bytes):
        node = params.get(index)
        if node is None:
            read += size
            continue
        mine = users.get(node.name, [])
        if node.name in in_place and all(u == root.name for u in mine):
            continue  # the buffer updated in place: not read
        sliced = [body.instructions[u] for u in mine]
        if sliced and all(u.opcode in SLICING and u.operands[:1] == [node.name] for u in sliced):
            read += sum(u.bytes for u in sliced)
        else:
            read += size
    return read + written


def _operand_bytes(name: str, comp: hlo.Computation) -> float:
    node = comp.instructions.get(name)
    return node.bytes if node is not None else 0.0


def _io_bytes(instr: hlo.Instruction, comp: hlo.Computation) -> float:
    """Its operands read and its result written, whole."""
    return sum(_operand_bytes(n, comp) for n in instr.operands) + instr.bytes


def trip_count(instr: hlo.Instruction, comp: hlo.Computation, module: hlo.Module) -> int | None:
    """A while loop's trip count: XLA's ``known_trip_count``, else ``counter < N`` in its condition
    with the counter's start a constant in the loop's initial tuple; ``None`` when neither reads."""
    found = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', instr.attrs)
    if found:
        return int(found.group(1))
    cond_name = re.search(r"\bcondition=%?([\w.\-]+)", instr.attrs)
    cond = module.computations.get(cond_name.group(1)) if cond_name else None
    if cond is None:
        return None
    root = cond.root
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = re.search(r"direction=(\w+)", root.attrs)
    a, b = (cond.instructions.get(n) for n in root.operands)
    if a is None or b is None or direction is None:
        return None
    if a.opcode == "constant" and b.opcode == "get-tuple-element":
        a, b = b, a
        direction = {"GT": "LT", "GE": "LE"}.get(direction.group(1))
    else:
        direction = direction.group(1)
    if a.opcode != "get-tuple-element" or b.opcode != "constant" or direction not in ("LT", "LE"):
        return None
    limit = b.integer_argument
    index = re.search(r"index=(\d+)", a.attrs)
    start = _initial(instr, comp, int(index.group(1))) if index else None
    if limit is None or start is None:
        return None
    return max(0, limit - start + (1 if direction == "LE" else 0))


def _initial(loop: hlo.Instruction, comp: hlo.Computation, index: int) -> int | None:
    """The constant the loop's counter starts at (element ``index`` of its initial tuple)."""
    init = comp.instructions.get(loop.operands[0]) if loop.operands else None
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return None
    start = comp.instructions.get(init.operands[index])
    if start is None:
        return None
    if start.opcode == "copy" and start.operands:  # a counter copied into the loop
        start = comp.instructions.get(start.operands[0])
    if start is not None and start.opcode == "constant":
        return start.integer_argument
    return None


class _Walker:
    def __init__(self, module: hlo.Module, peak_flops: float | None, bandwidth: float | None,
                 silent_kernel_flops: float):
        self.module, self.peak, self.bandwidth = module, peak_flops, bandwidth
        self.silent_kernel_flops = silent_kernel_flops
        self.cost = ProgramCost()
        self.silent: list[tuple[float, hlo.Instruction, float]] = []  # (times, call, bytes)

    def add(self, kind: str, flops: float, nbytes: float, times: float) -> None:
        compute = flops / self.peak if self.peak else 0.0
        memory = nbytes / self.bandwidth if self.bandwidth else 0.0
        cost = self.cost.kinds[kind]
        cost.flops += flops * times
        cost.bytes += nbytes * times
        cost.seconds += max(compute, memory) * times
        if compute >= memory:
            cost.compute_seconds += compute * times
        else:
            cost.memory_seconds += memory * times
        cost.launches += times

    def walk(self, comp: hlo.Computation, times: float) -> None:
        for instr in comp.instructions.values():
            op = instr.opcode
            if op in FREE:
                continue
            if op == "while":
                body = re.search(r"\bbody=%?([\w.\-]+)", instr.attrs)
                trips = trip_count(instr, comp, self.module)
                if trips is None:
                    self.cost.notes.append("a while loop's trip count could not be read: counted once")
                    trips = 1
                if body and body.group(1) in self.module.computations:
                    self.walk(self.module.computations[body.group(1)], times * trips)
                continue
            target = instr.attr("custom_call_target") or ""
            if op in ("call", "async-start") or (op == "custom-call" and instr.calls
                                                 and not hlo.is_kernel_target(target)):
                called = re.search(r"\b(?:to_apply|calls)=%?([\w.\-]+)", instr.attrs)
                if called and called.group(1) in self.module.computations:
                    self.walk(self.module.computations[called.group(1)], times)
                continue
            if op == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", instr.attrs)
                names = re.findall(r"%([\w.\-]+)", branches.group(1)) if branches else \
                    re.findall(r"(?:true|false)_computation=%([\w.\-]+)", instr.attrs)
                self.costliest_branch([self.module.computations[n] for n in names
                                       if n in self.module.computations], times)
                continue
            if op == "custom-call":
                if not hlo.is_kernel_target(target):
                    continue  # XLA's own bookkeeping calls (AllocateBuffer, Sharding, ...)
                io_bytes = _io_bytes(instr, comp)
                estimate = hlo.declared_cost(instr)
                if estimate and estimate.get("flops", 0) > 0:
                    self.add("kernel", estimate["flops"], estimate.get("bytes_accessed", io_bytes), times)
                else:
                    self.silent.append((times, instr, io_bytes))
                continue
            if op == "fusion":
                body = self.module.computations.get(instr.calls or "")
                flops = _body_flops(body, self.module) if body is not None else 0.0
                nbytes = _fusion_bytes(instr, comp, self.module)
                self.add("matmul" if flops else "other", flops, nbytes, times)
                continue
            flops = dot_flops(instr, comp) if op in ("dot", "convolution") else 0.0
            nbytes = _io_bytes(instr, comp)
            if op == "dynamic-update-slice" and len(instr.operands) > 1:
                nbytes = 2 * _operand_bytes(instr.operands[1], comp)  # in place: the update, read and written
            elif op in SLICING:
                nbytes = 2 * instr.bytes
            self.add("matmul" if flops else "other", flops, nbytes, times)

    def costliest_branch(self, branches: list[hlo.Computation], times: float) -> None:
        """A conditional costs its costliest branch: which one runs is decided on the chip (a causal
        kernel's skipped blocks), so this is the bound, and ``notes`` says so."""
        if not branches:
            return
        costs = []
        for branch in branches:
            walker = _Walker(self.module, self.peak, self.bandwidth, self.silent_kernel_flops)
            walker.walk(branch, times)
            costs.append(walker)
        worst = max(costs, key=lambda w: w.cost.total("seconds"))
        self.cost.add(worst.cost)
        self.silent.extend(worst.silent)
        if len(branches) > 1:
            self.cost.notes.append("a conditional: its costliest branch counted (the chip picks which runs)")

    def finish(self) -> ProgramCost:
        if self.silent:
            calls = sum(times for times, _, _ in self.silent)
            kernels = sorted({hlo.kernel_name(i) for _, i, _ in self.silent})
            self.cost.notes.append(f"no cost estimate from {', '.join(kernels)}: the step's FLOPs shared "
                                   "among its calls, and their operands' and results' bytes")
            for times, _, io_bytes in self.silent:
                self.add("kernel", self.silent_kernel_flops / calls, io_bytes, times)
        return self.cost


def program_cost(module: hlo.Module, *, peak_flops: float | None, bandwidth: float | None,
                 silent_kernel_flops: float) -> ProgramCost:
    """The program's cost by kind of op, at ``peak_flops`` FLOP/s and ``bandwidth`` bytes/s (per device).

    ``silent_kernel_flops``: what a kernel without a cost estimate computes (the step's FLOPs)."""
    entry = module.entry
    walker = _Walker(module, peak_flops, bandwidth, silent_kernel_flops)
    if entry is not None:
        walker.walk(entry, 1.0)
    return walker.finish()
