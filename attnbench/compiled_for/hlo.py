"""What the compiled (optimized) HLO text says: which kernel, and what the compiler put around it.

Reads ``compiled.as_text()`` with no framework. Copy bytes are physical: a TPU layout's tiling
(``T(8,128)``) pads the minor dimensions, so a ``head_dim`` of 64 laid out minor takes the room of
128. The parser knows HLO's text form only as far as this needs; an instruction may span lines
(kernel metadata holds newlines).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1, "f8e4m3fnuz": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "s4": 0.5, "u4": 0.5, "token": 0,
}
# Walked through but not counted: no new buffer in HBM (copy-start/-done move to another memory
# space, e.g. a prefetch into TPU VMEM). LAYOUT_OPS write a new buffer and are counted.
PASS_THROUGH = {"bitcast", "get-tuple-element", "copy-start", "copy-done", "tuple"}
LAYOUT_OPS = {"copy", "transpose", "pad", "reshape", "slice", "concatenate"}
MOVEMENT_BODY = LAYOUT_OPS | PASS_THROUGH | {"parameter", "constant", "broadcast"}
GENERIC_NAMES = {"pallas_call", "custom-call", "custom_call", "call"}

_INSTR = re.compile(r"^\s+(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s*->\s*.*\{\s*$")
_ARRAY = re.compile(r"\b([a-z]\w*)\[([^\]]*)\](\{[^}]*\})?")
_OPERAND = re.compile(r"%([\w.\-]+)")


@dataclass
class Instruction:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False
    arguments: str = ""  # the text inside the opcode's parentheses: a constant's literal, a parameter's index

    def attr(self, key: str) -> str | None:
        found = re.search(rf'\b{re.escape(key)}="((?:[^"\\]|\\.)*)"', self.attrs)  # \" stays inside
        return found.group(1) if found else None

    @property
    def calls(self) -> str | None:
        found = re.search(r"\bcalls=%?([\w.\-]+)", self.attrs)
        return found.group(1) if found else None

    @property
    def bytes(self) -> int:
        return shape_bytes(self.shape)

    @property
    def dims(self) -> list[int]:
        """The dimensions of its shape (a tuple's first array)."""
        found = _ARRAY.search(self.shape)
        return _dims(found.group(2)) if found else []

    @property
    def integer_argument(self) -> int | None:
        """The integer in its parentheses: a scalar ``constant(8)``'s literal, a ``parameter(0)``'s index."""
        found = re.fullmatch(r"\s*(-?\d+)\s*", self.arguments)
        return int(found.group(1)) if found else None


@dataclass
class Computation:
    name: str
    entry: bool = False
    instructions: dict[str, Instruction] = field(default_factory=dict)

    @property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions.values() if i.root), None)

    def users(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n: [] for n in self.instructions}
        for instr in self.instructions.values():
            for operand in instr.operands:
                if operand in out:
                    out[operand].append(instr.name)
        return out


@dataclass
class Module:
    computations: dict[str, Computation]

    @property
    def entry(self) -> Computation | None:
        return next((c for c in self.computations.values() if c.entry), None)

    def fusion_bodies(self) -> set[str]:
        return {i.calls for c in self.computations.values() for i in c.instructions.values()
                if i.opcode == "fusion" and i.calls}

    def instructions(self, *, include_fusion_bodies: bool = False):
        bodies = set() if include_fusion_bodies else self.fusion_bodies()
        for comp in self.computations.values():
            if comp.name not in bodies:
                yield comp, from_values(comp.instructions)


def from_values(mapping):
    return list(mapping.values())


# --------------------------------------------------------------------------------- parsing
def _balanced(text: str, start: int, open_: str = "(", close: str = ")") -> int:
    """Index just past the bracket closing the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _parse_instruction(name: str, body: str, root: bool) -> Instruction | None:
    body = body.strip()
    if body.startswith("("):
        end = _balanced(body, 0)
        shape, rest = body[:end], body[end:].lstrip()
    else:
        shape, _, rest = body.partition(" ")
    found = re.match(r"([\w\-]+)\(", rest)
    if not found:
        return None
    opcode = found.group(1)
    end = _balanced(rest, found.end() - 1)
    arguments = rest[found.end():end - 1]
    return Instruction(name, shape, opcode, _OPERAND.findall(arguments), rest[end:], root, arguments)


def parse_module(text: str) -> Module:
    """Computations and their instructions from an HLO module's text."""
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    pending: list | None = None  # [root, name, body] of the instruction being read

    def flush():
        nonlocal pending
        if pending and current is not None:
            instr = _parse_instruction(pending[1], pending[2], pending[0])
            if instr is not None:
                current.instructions[instr.name] = instr
        pending = None

    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header:
                current = Computation(header.group(2), entry=bool(header.group(1)))
                computations[current.name] = current
            continue
        if line.rstrip() == "}":
            flush()
            current = None
            continue
        found = _INSTR.match(line)
        if found and line.startswith("  "):
            flush()
            pending = [bool(found.group(1)), found.group(2), found.group(3)]
        elif pending is not None:
            pending[2] += "\n" + line
    flush()
    return Module(computations)


# ---------------------------------------------------------------------------------- shapes
def _dims(dims_text: str) -> list[int]:
    """``4,<=128,64`` as ``[4, 128, 64]`` (a dynamic dimension at its bound)."""
    return [int(d.strip().lstrip("<=")) for d in dims_text.split(",") if d.strip()]


def _array_bytes(dtype: str, dims_text: str, layout: str | None, physical: bool) -> float:
    width = DTYPE_BYTES.get(dtype)
    if width is None:
        return 0
    dims = _dims(dims_text)
    if physical and layout and dims:
        inner = layout[1:-1]
        order_text, _, tiling = inner.partition(":")
        try:
            minor_to_major = [int(x) for x in order_text.split(",") if x.strip()]
        except ValueError:
            minor_to_major = []
        tile = re.match(r"T\(([\d,]+)\)", tiling.strip())
        if tile and len(minor_to_major) == len(dims):
            sizes = [int(t) for t in tile.group(1).split(",")]
            dims = list(dims)
            # The tile's last size applies to the most minor dimension, and so on outwards.
            for size, dim in zip(reversed(sizes), minor_to_major, strict=False):
                dims[dim] = math.ceil(dims[dim] / size) * size
    return width * math.prod(dims)


def shape_bytes(shape: str, *, physical: bool = True) -> int:
    """Bytes of an HLO shape (array or tuple); ``physical``: with the layout's tile padding."""
    return int(sum(_array_bytes(dtype, dims, layout, physical)
                   for dtype, dims, layout in _ARRAY.findall(shape)))


# ---------------------------------------------------------------------------- custom calls
@dataclass(frozen=True)
class CustomCall:
    instruction: str
    target: str
    kernel: str
    cost_estimate: dict | None  # a Mosaic kernel's own {flops, transcendentals, bytes_accessed}


def _strip_wrappers(part: str) -> str:
    while True:
        found = re.fullmatch(r"[\w\-]+\((.*)\)", part)
        if not found:
            return part
        part = found.group(1)


def kernel_name(instr: Instruction) -> str:
    """The instruction's name, else the op_name component before ``pallas_call``."""
    base = re.sub(r"(\.\d+)+$", "", instr.name)
    # jax names a kernel traced under transformations "jvp_jit_flash_attention__": unwrap it.
    base = re.sub(r"^((jvp|jit|vmap|transpose|remat|checkpoint)_)+", "", base).strip("_") or base
    if base not in GENERIC_NAMES:
        return base
    op_name = instr.attr("op_name") or ""
    parts = [_strip_wrappers(p) for p in op_name.split("/") if p]
    for i, part in enumerate(parts):
        if part == "pallas_call" and i > 0:
            return parts[i - 1]
    return parts[-1] if parts else base


def declared_cost(instr: Instruction) -> dict | None:
    """A Pallas kernel's own ``cost_estimate`` ({flops, transcendentals, bytes_accessed}); None if none."""
    found = re.search(r'"cost_estimate"\s*:\s*(\{[^{}]*\})', instr.attrs)
    if not found:
        return None
    try:
        raw = json.loads(found.group(1))
    except json.JSONDecodeError:
        return None
    return {k: float(v) for k, v in raw.items() if str(v).lstrip("-").replace(".", "", 1).isdigit()}


def custom_calls(module: Module) -> list[CustomCall]:
    out = []
    for _, instrs in module.instructions(include_fusion_bodies=True):
        for instr in instrs:
            if instr.opcode == "custom-call":
                target = instr.attr("custom_call_target") or "?"
                out.append(CustomCall(instr.name, target, kernel_name(instr), declared_cost(instr)))
    return out


# Custom-call targets that are kernels; the others XLA inserts itself (AllocateBuffer, Sharding, ...).
KERNEL_TARGETS = re.compile(r"^(tpu_custom_call|__cudnn\$|__gpu\$xla\.gpu\.triton|mosaic_gpu|__triton)")


def is_kernel_target(target: str) -> bool:
    return bool(KERNEL_TARGETS.match(target))


def kernel_calls(calls: list[CustomCall]) -> list[CustomCall]:
    return [c for c in calls if is_kernel_target(c.target)]


def fusion_counts(module: Module) -> tuple[int, int]:
    """(fusions outside fusion bodies, how many of them XLA lowers through Triton itself)."""
    total = triton = 0
    for _, instrs in module.instructions():
        for instr in instrs:
            if instr.opcode == "fusion":
                total += 1
                if '"kind":"__triton' in instr.attrs:
                    triton += 1
    return total, triton


def kernel_evidence(module: Module, *, interpret: bool = False) -> str:
    """One line: which kernel the compiled program calls, read from its custom calls."""
    calls = kernel_calls(custom_calls(module))
    if calls:
        by_target: dict[str, list[str]] = {}
        for call in calls:
            names = by_target.setdefault(call.target, [])
            if call.kernel not in names:
                names.append(call.kernel)
        return "; ".join(f"{target}: {', '.join(names)}" for target, names in by_target.items())
    total, triton = fusion_counts(module)
    text = f"no custom call: plain XLA fusions ({total}"
    text += f", {triton} of them XLA's own Triton fusions)" if triton else ")"
    if interpret:
        text += " - the Pallas interpreter: the kernel body as plain XLA ops"
    return text


# Tokamax names every op it traces "tokamax:<json>" (ops/op.py: the op with the config it chose, and
# its arguments), so the compiled program's metadata says which config a Tokamax kernel was built at.
_TOKAMAX_SCOPE = re.compile(
    r'tokamax:(\{\\"op\\":\{\\"__type\\":\\"([\w.]+)\\",\\"config\\":(\{[^{}]*\}|null))')


def tokamax_configs(text: str) -> str:
    """``Op block_q=128,...`` per Tokamax op in the compiled HLO text (its metadata's op names), each
    once; ``""`` when none. A config of ``null`` is an op without knobs."""
    seen: dict[str, str] = {}
    for _, op_type, config in _TOKAMAX_SCOPE.findall(text):
        op = op_type.rsplit(".", 1)[-1]
        if config == "null":
            words = "no config"
        else:
            try:
                values = json.loads(config.replace('\\"', '"'))
            except json.JSONDecodeError:
                continue
            words = ",".join(f"{k}={json.dumps(v)}" for k, v in values.items()) or "no config"
        seen.setdefault(f"{op} {words}", op)
    return "; ".join(seen)


def flops_source(module: Module) -> str:
    """Where the compiler's FLOP count comes from: XLA's ops, and each kernel's own cost estimate."""
    calls = kernel_calls(custom_calls(module))
    if not calls:
        return "xla: counted by XLA from its ops"
    estimated = sorted({c.kernel for c in calls if c.cost_estimate and c.cost_estimate.get("flops", 0) > 0})
    silent = sorted({c.kernel for c in calls if c.kernel not in estimated})
    parts = []
    if estimated:
        parts.append(f"hand-written cost_estimate of {', '.join(estimated)}")
    if silent:
        parts.append(f"none from {', '.join(silent)} (no cost estimate: its FLOPs are not counted)")
    return "; ".join(parts) + " (+ XLA's ops outside the kernel)"


# ------------------------------------------------------------------------ inserted copies
@dataclass(frozen=True)
class Copy:
    instruction: str
    opcode: str
    side: str  # "in" (before a custom call) or "out" (after it)
    bytes: int


def _is_movement_fusion(instr: Instruction, module: Module) -> bool:
    body = module.computations.get(instr.calls or "")
    if instr.opcode != "fusion" or body is None:
        return False
    ops = {i.opcode for i in body.instructions.values()}
    return ops <= MOVEMENT_BODY and bool(ops & LAYOUT_OPS)


def _kind(instr: Instruction, module: Module) -> str | None:
    if instr.opcode in PASS_THROUGH:
        return "pass"
    if instr.opcode in LAYOUT_OPS or _is_movement_fusion(instr, module):
        return "copy"
    return None


def inserted_copies(module: Module) -> list[Copy]:
    """Layout copies the compiler put around kernel calls, each once: walked through pure data
    movement back from the operands and forward from the results until something computes."""
    found: dict[str, Copy] = {}
    for comp in module.computations.values():
        users = None
        for instr in comp.instructions.values():
            if instr.opcode != "custom-call" or not is_kernel_target(instr.attr("custom_call_target") or ""):
                continue
            users = users or comp.users()
            seen: set[str] = set()

            def walk(names, step, direction, comp=comp, seen=seen):
                """Follow layout-only instructions from ``names`` (``step``: the next names)."""
                stack = list(names)
                while stack:
                    name = stack.pop()
                    node = comp.instructions.get(name)
                    if node is None or name in seen:
                        continue
                    seen.add(name)
                    kind = _kind(node, module)
                    if kind == "copy" and name not in found:
                        found[name] = Copy(name, node.opcode, direction, node.bytes)
                    if kind:
                        stack.extend(step(node))

            walk(instr.operands, lambda node: node.operands, "in")  # backwards: the producers
            walk(users.get(instr.name, []), lambda node, users=users: users.get(node.name, []),
                 "out")  # forwards: the consumers
    return list(found.values())


def describe_copies(copies: list[Copy]) -> str:
    """``in: 3 copy (50.3 MB); out: 1 copy (16.8 MB)``, or ``none``."""
    if not copies:
        return "none"
    parts = []
    for side in ("in", "out"):
        mine = [c for c in copies if c.side == side]
        if not mine:
            continue
        ops: dict[str, int] = {}
        for c in mine:
            ops[c.opcode] = ops.get(c.opcode, 0) + 1
        total = sum(c.bytes for c in mine)
        ops_text = ", ".join(f"{n} {op}" for op, n in sorted(ops.items()))
        parts.append(f"{side}: {ops_text} ({total / 1e6:.1f} MB)")
    return "; ".join(parts)
