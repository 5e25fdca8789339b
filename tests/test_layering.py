"""The package's layers: no import cycles; the hosts' side (runtime, engines, the folder contract) never needs the
exporter, the training code or the CLI (a deployment installs numpy, onnxruntime and click only); the runtime stands
on its own; the folder contract and the base modules sit below the runtime, the engines and the exporter; the
exporter writes folders without the engines that read them.

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
NOT_ON_HOST_SIDE = ("spot.export", "spot.training", "spot.cli", "spot.app")
# the modules every layer may stand on (they import only each other)
BASE = ("spot.assets", "spot.chat_template", "spot.checkpoint", "spot.config", "spot.descriptors", "spot.drafter_files",
        "spot.errors", "spot.exact_math", "spot.files", "spot.gsm8k", "spot.ortlib", "spot.owned", "spot.progress",
        "spot.prompts", "spot.replace", "spot.schema", "spot.tokenizer")
# (modules, what none of them imports, directly or through others)
LAYER_RULES = [
    (("spot.runtime",), ("spot.export", "spot.reference", "spot.training", "spot.cli", "spot.serve")),
    (("spot.folder", *BASE), ("spot.runtime", "spot.engines", "spot.export")),
    (("spot.export",), ("spot.engines",)),
    # the application layer (spot/app: bench, demo, --model, tuned budgets, requests, plots) sits on top
    (("spot.runtime", "spot.engines", "spot.folder", "spot.export", "spot.reference", *BASE), ("spot.app",)),
]


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


def imports_of(source: str, name: str, package: str, modules) -> set[str]:
    """The spot modules the source of module `name` (in `package`) imports: every import statement, at module level,
    in a function, under `if TYPE_CHECKING` alike (its own parent packages left out: importing a module runs them)."""
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets |= {base} | {f"{base}.{a.name}" for a in node.names}
    found = {_within(t, modules) for t in targets}
    return {t for t in found if t and t != name and not name.startswith(t + ".")}


def import_graph() -> dict[str, set[str]]:
    """module -> the spot modules it imports (imports_of)."""
    modules = module_names()
    return {name: imports_of(path.read_text(), name, name if path.name == "__init__.py" else name.rpartition(".")[0],
                             modules) for name, path in modules.items()}


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


def test_every_import_statement_is_an_edge_wherever_it_stands():
    """A function-level import, one under TYPE_CHECKING and a relative one count as the module-level ones do: a
    layering rule cannot be dodged by importing late."""
    modules = {"spot", "spot.folder", "spot.folder.x", "spot.folder.y", "spot.runtime", "spot.runtime.step",
               "spot.engines", "spot.engines.buckets", "spot.export", "spot.export.z"}
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from spot.engines.buckets import Profile\n"
              "def f():\n    import spot.runtime.step\n    return spot.runtime.step\n"
              "class C:\n    def g(self):\n        from .y import thing\n        from ..export import z\n")
    assert imports_of(source, "spot.folder.x", "spot.folder", modules) == {
        "spot.engines.buckets", "spot.runtime.step", "spot.folder.y", "spot.export", "spot.export.z"}


def layering_breaches(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """module -> what it reaches that a rule of LAYER_RULES forbids it."""
    def within(module: str, prefixes) -> bool:
        return any(module == p or module.startswith(p + ".") for p in prefixes)
    bad = {}
    for modules, forbidden in LAYER_RULES:
        for module in graph:
            if within(module, modules):
                wrong = sorted(m for m in reachable(graph, module) if within(m, forbidden))
                if wrong:
                    bad[module] = wrong
    return bad


def test_each_layer_imports_only_the_layers_below_it():
    """The runtime needs none of the exporter, the torch reference, training, the CLI or the server; the folder
    contract and the base modules none of the runtime, the engines or the exporter; the exporter not the engines
    (LAYER_RULES), through function-level imports too."""
    assert layering_breaches(import_graph()) == {}, "move what both need down to the lower layer"
    assert layering_breaches({"spot.folder.manifest": {"spot.config"}, "spot.config": {"spot.runtime.drafter"},
                              "spot.runtime.drafter": set()}) == {"spot.config": ["spot.runtime.drafter"],
                                                                  "spot.folder.manifest": ["spot.runtime.drafter"]}


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
            "import spot.runtime.decode_plan, spot.runtime.drafter, spot.folder.manifest, spot.folder.epilogue\n"
            "print(sorted(m for m in sys.modules if m.startswith(('spot.export', 'spot.training', 'torch', 'onnx'))\n"
            "             and not m.startswith('onnxruntime')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
