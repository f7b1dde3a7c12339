"""The import graph of the project's own modules (module- and function-level imports alike).

Read from the source with ``ast``: nothing is imported. ``from package import submodule`` counts
as importing the submodule; naming a package's own attribute counts as importing the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attnbench", "attention_impls")
KNOWN_CYCLES: list[set[str]] = []  # none is left; a new one fails the test
# What the kernels may take from the harness: the workload value type, the masks and the error for an
# unknown name; base.py asks the framework's backend where a kernel can run.
KERNEL_IMPORTS = {"attnbench.core.workload", "attnbench.core.masks", "attnbench.core.errors"}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in found:
                return ".".join(parts[:end])
        return None

    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [resolve(f"{base}.{alias.name}") or resolve(base) for alias in node.names]
            graph[name].update(t for t in targets if t and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_project_has_no_import_cycle():
    found = cycles(import_graph(modules()))
    assert [c for c in found if c not in KNOWN_CYCLES] == []


def _group(name: str) -> str:
    return name.split(".")[1] if name.startswith("attnbench.") else name.split(".")[0]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """core/ imports only core/; results/ and report/ read what was measured and never import the
    measuring side (measure/, run/, backends/)."""
    out = []
    for name, targets in sorted(graph.items()):
        groups = {_group(t) for t in targets if t.startswith("attnbench.")}
        if _group(name) == "core" and groups - {"core"}:
            out.append(f"{name} imports {sorted(groups - {'core'})}")
        if _group(name) in ("results", "report") and groups & {"measure", "run", "backends"}:
            out.append(f"{name} imports {sorted(groups & {'measure', 'run', 'backends'})}")
    return out


def test_the_value_types_import_nothing_else_and_the_readers_never_measure():
    assert layer_violations(import_graph(modules())) == []




def transitive_layer_violations(graph: dict[str, set[str]], allowed=frozenset()) -> list[str]:
    """``layer_violations`` over what each module imports transitively (``allowed``: edges left
    out), each as the import path that breaks the rule."""
    from collections import deque

    def reach(start: str) -> dict[str, list[str]]:
        paths, queue = {start: [start]}, deque([start])
        while queue:
            node = queue.popleft()
            for nxt in sorted(graph.get(node, ())):
                if nxt not in paths and (node, nxt) not in allowed:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
        return paths

    out = []
    for name in sorted(graph):
        group = _group(name)
        forbidden = ({"*"} if group == "core" else
                     {"measure", "run", "backends"} if group in ("results", "report") else set())
        for target, path in sorted(reach(name).items()):
            tgroup = _group(target)
            if target.startswith("attnbench.") and target != name and (
                    (group == "core" and tgroup != "core") or tgroup in forbidden):
                out.append(" -> ".join(path))
                break
    return out


def test_the_layer_rule_holds_transitively():
    assert transitive_layer_violations(import_graph(modules())) == []


def test_the_transitive_rule_names_the_path():
    graph = {"attnbench.results.hosts": {"attnbench.hardware.fingerprint"},
             "attnbench.hardware.fingerprint": {"attnbench.backends"}, "attnbench.backends": set()}
    assert transitive_layer_violations(graph) == [
        "attnbench.results.hosts -> attnbench.hardware.fingerprint -> attnbench.backends"]
    allowed = {("attnbench.hardware.fingerprint", "attnbench.backends")}
    assert transitive_layer_violations(graph, allowed) == []


def test_the_layer_rule_names_a_reader_that_measures():
    graph = {"attnbench.report.verdict": {"attnbench.measure.engine", "attnbench.core.records"},
             "attnbench.core.records": {"attnbench.hardware"}}
    assert layer_violations(graph) == ["attnbench.core.records imports ['hardware']",
                                       "attnbench.report.verdict imports ['measure']"]


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_the_kernels_take_only_the_value_types_from_the_harness():
    found = modules()
    graph = import_graph(found)
    for name in found:
        if not name.startswith("attention_impls"):
            continue
        harness = {t for t in graph[name] if t.startswith("attnbench")}
        assert harness <= KERNEL_IMPORTS, f"{name} imports {sorted(harness - KERNEL_IMPORTS)} of the harness"
