"""Imports stand at the top of a module, where a reader sees its dependencies. A function-level import of a spot module
is allowed only where it loads a heavy optional package late (torch, onnx, tensorrt, the server's FastAPI, matplotlib:
HEAVY below, each with its reason), in the CLI's command bodies (spot/cli: `import spot.cli` and `spot --help` stay
fast), or where a module `import spot.cli` loads would otherwise load more at start-up (STARTUP). Each one that stays
says why in a comment; none repeats what its file imports at the top."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# spot modules that import a heavy optional package at their top: imported late by the modules that need them
HEAVY = {
    "spot.export": "onnx, torch (spot[export])",
    "spot.reference": "torch (spot[export])",
    "spot.engines.torch_engine": "torch (spot[export])",
    "spot.serve.app": "fastapi, starlette (spot[serve])",
    "spot.training.arithmetic_corpus": "tokenizers' trainer",
}
# (file, imported module): imported late so that `import spot.cli` loads no more than it needs
STARTUP = {
    ("spot/entry.py", "spot.cli"): "imported under a signal handler",
    ("spot/config.py", "spot.assets"): "the embedded models' table",
    ("spot/app/models.py", "spot.assets"): "the embedded models' table",
    ("spot/app/models.py", "spot.app.demo"): "the demo's export",
    ("spot/app/models.py", "spot.tokenizer"): "the tokenizer",
    ("spot/app/models.py", "spot.runtime.drafter"): "the drafter",
    ("spot/engines/factory.py", "spot.engines.ort_engine"): "the engines, when one opens",
    ("spot/engines/factory.py", "spot.engines.ort_sessions"): "the engines, when one opens",
    ("spot/engines/factory.py", "spot.engines.tensorrt_engine"): "the engines, when one opens",
    ("spot/runtime/libm.py", "spot.runtime"): "the optional C extension _libm",
}
# files another change is rewriting now: their function-level imports are left as they are until it merges
PENDING_MERGE: set[str] = set()      # files another branch edited while the rule landed: none left


def function_imports(tree: ast.Module):
    """(function, import statement) for every import inside a function."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield fn, node


def imported_module(node) -> str:
    return node.module if isinstance(node, ast.ImportFrom) else node.names[0].name


def top_bindings(tree: ast.Module) -> set[tuple]:
    """What the module's top-level import statements bind: (module, name, alias)."""
    bound = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            bound |= {(node.module, a.name, a.asname) for a in node.names}
        elif isinstance(node, ast.Import):
            bound |= {(a.name, None, a.asname) for a in node.names}
    return bound


def is_allowed(path: str, module: str) -> bool:
    def under(prefixes):
        return any(module == p or module.startswith(p + ".") for p in prefixes)
    return (path.startswith("spot/cli/") or path in PENDING_MERGE or under(HEAVY)
            or any(path == p and module == m for p, m in STARTUP))


def late_imports_breaking_the_rule(files: dict[str, str]) -> list[str]:
    """path:line: statement, for each function-level import of a spot module is_allowed does not allow."""
    bad = []
    for path, source in files.items():
        for _, node in function_imports(ast.parse(source)):
            module = imported_module(node)
            if module.split(".")[0] == "spot" and not is_allowed(path, module):
                bad.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return bad


def spot_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "spot").rglob("*.py"))}


def test_function_level_imports_of_spot_modules_are_the_allowed_ones():
    assert late_imports_breaking_the_rule(spot_sources()) == [], \
        "import it at the module's top (or, for a heavy optional package, add it to HEAVY with its reason)"


def test_the_rule_catches_a_late_import_outside_the_cli():
    files = {"spot/runtime/x.py": "def f():\n    from spot.runtime.step import Sampling\n",
             "spot/cli/y.py": "def g():\n    from spot.app.bench_run import run_bench\n",
             "spot/app/bench_run.py": "def h():\n    from spot.export.roofline import pass_time\n"}
    assert late_imports_breaking_the_rule(files) == ["spot/runtime/x.py:2: from spot.runtime.step import Sampling"]


def test_no_function_level_import_repeats_a_top_level_one():
    repeats = []
    for path, source in spot_sources().items():
        tree = ast.parse(source)
        top = top_bindings(tree)
        for _, node in function_imports(tree):
            mine = top_bindings(ast.Module(body=[node], type_ignores=[]))
            if mine <= top:
                repeats.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert repeats == []


def test_every_function_level_import_says_why_it_is_late():
    """A comment on its line, or on the line above it or above the run of imports it opens."""
    silent = []
    for path, source in spot_sources().items():
        if path in PENDING_MERGE:
            continue
        lines = source.splitlines()
        late = list(function_imports(ast.parse(source)))
        ending_on = {node.end_lineno: node for _, node in late}
        for fn, node in late:
            row = node.lineno - 1               # 0-based line of the first import of its run
            while row in ending_on:
                row = ending_on[row].lineno - 1
            above = lines[row - 1].strip() if row else ""
            if "#" not in lines[node.lineno - 1] and not above.startswith("#") and not (
                    above == "try:" and lines[row - 2].strip().startswith("#")):
                silent.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert silent == [], "say why the import is late: e.g. `# torch: optional extra (spot[export])`"


def test_importing_the_cli_and_the_runtime_loads_no_heavy_package():
    """`import spot.cli` (spot --help) and the runtime load neither torch, onnx, the exporter nor the server."""
    code = ("import sys\n"
            "import spot.cli, spot.runtime.decode, spot.engines.factory\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnx', 'tensorrt', 'fastapi',\n"
            "             'matplotlib', 'jinja2', 'tokenizers') or m.startswith(('spot.export', 'spot.serve',\n"
            "             'spot.app.demo', 'spot.training', 'spot.app.bench_run'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_entry_point_loads_no_numpy_before_its_signal_handler():
    """spot.entry imports spot.errors before it handles Ctrl-C: numpy (a third of a second) loads after, under it."""
    code = "import sys, spot.entry\nprint('numpy' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
