"""What a framework's profiler says one step ran: ``OpTime`` values, and the reading of an XLA
profile (jax's and torch_xla's ``*.xplane.pb``) that two backends share. Each backend's
``profile_ops`` runs its framework's profiler around a step (docs/kernels.md, "observability")."""

from __future__ import annotations

import dataclasses
import glob
import os
import re

# Imported where used: jax (its ``ProfileData`` reads an xplane; not every venv has jax).


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One profiled op: its name as the profiler shows it, its self time (children excluded), and
    the names of the ops it runs inside, outermost first."""

    name: str
    seconds: float
    within: tuple[str, ...] = ()


class ProfileUnreadable(RuntimeError):
    """The framework's profiler ran, but its output cannot be read here: no verdict, this reason."""


HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")


def hlo_instructions(hlo_text: str) -> dict[str, dict[str, str]]:
    """``{instruction: {"target": custom_call_target, "op_name": metadata op_name}}`` of one module."""
    out = {}
    for line in hlo_text.splitlines():
        found = HLO_INSTRUCTION.match(line)
        if not found:
            continue
        target = re.search(r'custom_call_target="([^"]+)"', line)
        op_name = re.search(r'op_name="([^"]+)"', line)
        out[found.group(1)] = {"target": target.group(1) if target else "",
                               "op_name": op_name.group(1) if op_name else ""}
    return out


def read_xplane(log_dir: str):
    """``jax.profiler.ProfileData`` of the one ``*.xplane.pb`` a trace wrote under ``log_dir``."""
    from jax.profiler import ProfileData

    found = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
    if not found:
        raise RuntimeError(f"the profiler wrote no *.xplane.pb under {log_dir}")
    return ProfileData.from_file(found[0])


@dataclasses.dataclass(frozen=True)
class XlaEvent:
    name: str  # hlo_op, with " (custom_call_target)" for a custom call
    start_ns: int
    end_ns: int
    op_name: str  # the instruction's metadata op_name (not in the profile)


def xla_events(data, modules: dict[str, dict] | None = None) -> list[list[XlaEvent]]:
    """Per profiler line, its XLA op events (those with an ``hlo_op`` stat), by start time.
    ``modules``: ``{hlo_module: hlo_instructions(...)}``, for custom-call targets and op_name."""
    lines = []
    for plane in data.planes:
        for line in plane.lines:
            events = []
            for event in line.events:
                stats = dict(event.stats)
                hlo_op = stats.get("hlo_op")
                if not hlo_op:
                    continue
                info = (modules or {}).get(stats.get("hlo_module", ""), {}).get(hlo_op, {})
                name = f"{hlo_op} ({info['target']})" if info.get("target") else str(hlo_op)
                # Whatever op naming the profile itself carries beside hlo_op counts as its name.
                shown = [str(stats[k]) for k in ("tf_op", "long_name", "name_scope") if stats.get(k)]
                if shown:
                    name += " [" + "; ".join(shown) + "]"
                events.append(XlaEvent(name, int(event.start_ns), int(event.end_ns), info.get("op_name", "")))
            if events:
                lines.append(sorted(events, key=lambda e: (e.start_ns, -e.end_ns)))
    return lines


def xla_op_times(lines: list[list[XlaEvent]], label=lambda e: e.name) -> list[OpTime]:
    """Self times: an event's duration less that of the XLA events nested in it on its line."""
    return [op for events in lines for op in _line_op_times(events, label)]


def _line_op_times(events: list[XlaEvent], label) -> list[OpTime]:
    ops: list[OpTime] = []
    stack: list[tuple[XlaEvent, list[float]]] = []  # open events, each with its nested events' time

    def close(until: int) -> None:
        while stack and stack[-1][0].end_ns <= until:
            event, nested = stack.pop()
            scopes = tuple(p for p in event.op_name.split("/") if p)  # the HLO's, outermost first
            ops.append(OpTime(label(event), max(0.0, (event.end_ns - event.start_ns - nested[0]) / 1e9),
                              tuple(label(e) for e, _ in stack) + scopes))

    for event in events:
        close(event.start_ns)
        if stack:
            stack[-1][1][0] += event.end_ns - event.start_ns
        stack.append((event, [0.0]))
    close(2**63)
    return ops


DEVICE_PLANES = ("/device:GPU:", "/device:TPU:")  # XLA's plane names for an accelerator's own events
XLA_MODULE_LINE = "XLA Modules"  # a device plane's line of whole executables, one event per run


def device_busy_seconds(data, *, planes: tuple[str, ...] = DEVICE_PLANES, skip_module: str = "") -> float:
    """Seconds a device was busy in a profile: the union of the intervals of its XLA events (those
    with an ``hlo_op``: kernels on a GPU's streams, ops on a TPU's XLA Ops line; where a plane has none,
    its XLA Modules line), so overlapping lines and streams count once and idle gaps, such as the
    host's dispatch between calls, not at all: Tokamax's "total op time" (disjoint interval union).
    ``planes``: name prefixes of the planes read; ``skip_module``: an executable left out by its name's
    prefix (the L2 flush run between timed calls). ``ProfileUnreadable`` when no event was found."""
    intervals = []
    for plane in data.planes:
        if not plane.name.startswith(planes):
            continue
        ops, modules = [], []
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                module = str(stats.get("hlo_module") or (event.name if line.name == XLA_MODULE_LINE else ""))
                if skip_module and module.startswith(skip_module):
                    continue
                if stats.get("hlo_op"):
                    ops.append((int(event.start_ns), int(event.end_ns)))
                elif line.name == XLA_MODULE_LINE:
                    modules.append((int(event.start_ns), int(event.end_ns)))
        intervals += ops or modules
    if not intervals:
        raise ProfileUnreadable(f"the profile has no XLA event on a plane named {' or '.join(planes)}*")
    busy, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            busy, reach = busy + end - start, end
        elif end > reach:
            busy, reach = busy + end - reach, end
    return busy / 1e9
