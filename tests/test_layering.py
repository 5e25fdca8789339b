"""The package's layers: no import cycles, and the hosts' side (runtime, engines, the folder contract) never needs
the exporter, the training code or the CLI (a deployment installs numpy, onnxruntime and click only).

Imports are read from the source (every `import`, at module level or inside a function), so a cycle hidden behind a
lazy import counts as one.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST_SIDE = ("spot.runtime", "spot.engines", "spot.folder")
NOT_ON_HOST_SIDE = ("spot.export", "spot.training", "spot.cli", "spot.bench", "spot.demo")


def module_names() -> dict[str, Path]:
    names = {}
    for path in (ROOT / "spot").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _within(name: str, modules) -> str | None:
    """The spot module `name` refers to (a name imported from a module is that module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the spot modules it imports (its own parent packages left out: importing a module runs them)."""
    modules = module_names()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        found = {_within(t, modules) for t in targets}
        graph[name] = {t for t in found if t and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_the_import_graph_reader_sees_lazy_imports_and_cycles():
    """The checks below can fail: a function-level import is an edge, and a two-module loop is a cycle."""
    graph = import_graph()
    assert "spot.runtime.libm" in graph["spot.runtime.noise"] or "spot.runtime.native" in graph["spot.runtime.noise"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_the_packages_modules():
    assert cycles(import_graph()) == [], "break the cycle by moving the shared part to a module both import"


def test_the_host_side_never_imports_the_exporter_training_or_cli():
    graph = import_graph()
    bad = {}
    for module in graph:
        if module.startswith(HOST_SIDE):
            wrong = sorted(m for m in reachable(graph, module) if m.startswith(NOT_ON_HOST_SIDE))
            if wrong:
                bad[module] = wrong
    assert bad == {}, "the hosts read the folder contract (spot.folder), not spot.export"


def test_decoding_an_export_on_onnx_runtime_loads_neither_the_exporter_nor_onnx():
    """At run time too (the static check above cannot see imports made by name): the ORT engine, the device KV
    cache, the decoders and the drafter load without spot.export, torch or the onnx package."""
    code = ("import sys\n"
            "import spot.engines.ort_engine, spot.engines.device_kv, spot.engines.static_ort, spot.engines.factory\n"
            "import spot.runtime.decoders, spot.runtime.drafter, spot.folder.manifest, spot.folder.epilogue\n"
            "print(sorted(m for m in sys.modules if m.startswith(('spot.export', 'spot.training', 'torch', 'onnx'))\n"
            "             and not m.startswith('onnxruntime')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
