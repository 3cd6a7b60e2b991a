"""The package's import graph: every module imports on its own, and no module imports one that imports
it back (DESIGN: arrows point one way).

The graph is read from the source with `ast`, imports inside functions included (a deferred import
hides a cycle from Python but not from a reader). `from mlptrain.a import b` is an arrow to the module
`mlptrain.a.b` when there is one, else to `mlptrain.a`; the implicit import of a parent package's
`__init__` is not an arrow (a package importing its own submodules is not a cycle).
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import mlptrain

PACKAGE = Path(mlptrain.__file__).resolve().parent


def modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                           for alias in node.names)
    return {t for t in targets if t in known and t != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, colouring the modules on the path)."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    edges = graph()
    assert len(edges) > 40 and "mlptrain.training.loop" in edges["mlptrain.cli.run"] | edges["mlptrain.sweep.engine"]
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_deferred_imports_are_arrows(tmp_path):
    """A cycle through an import inside a function (resume.py once imported train.py so) is seen."""
    module = tmp_path / "resume.py"
    module.write_text("import numpy\n\ndef f():\n    from mlptrain.training.loop import train\n    from mlptrain import errors\n")
    known = {"mlptrain.training.loop", "mlptrain.errors", "mlptrain.training.resume"}
    assert imported("mlptrain.training.resume", module, known) == {"mlptrain.training.loop", "mlptrain.errors"}


def test_every_module_imports_on_its_own():
    """Each module is imported in one fresh interpreter with every mlptrain module dropped from
    sys.modules before it, so none relies on another having been imported first (third-party modules
    stay loaded: that keeps this fast and changes nothing about the package's own order)."""
    names = sorted(modules())
    script = (
        "import importlib, json, sys, traceback\n"
        "failures = {}\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'mlptrain' or m.startswith('mlptrain.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException:\n"
        "        failures[name] = traceback.format_exc(limit=-3)\n"
        "print(json.dumps(failures))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{name}:\n{trace}" for name, trace in failures.items())
