"""The package's import graph: every module imports on its own, no module imports one that imports it back,
no folder imports one that imports it back, and every arrow points down the layers below (DESIGN: arrows
point one way). Only the backends import numba, and an import inside a function says why it is there.

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

# The folders (and top-level modules) of the package, top to bottom: a module imports modules of its own
# layer or of a lower one, never of a higher one. Within a layer, the folder graph must still have no loop.
LAYERS = (
    ("__main__", "cli", "api"),  # the command, and the same from Python
    ("sweep", "seeds", "probe", "export"),  # workflows over many runs or over a trained run
    ("packing",),  # several runs of one shape trained at once from one thread
    ("inference",),  # a trained run loaded back
    ("training",),  # one run: the loop and its collaborators
    ("run_dirs", "nn", "data", "backends"),  # run folders; models; datasets; devices and their kernels
    ("optim", "config"),  # the step rules both kernel sets compile; the config schema
    ("util",),  # files, paths, host memory, the console
    ("errors", "activation", "dtypes", ""),  # "": the package's own __init__ (version, start time)
)


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


def folder(module: str) -> str:
    """The package's folder (or top-level module) that `module` belongs to; "" for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def folder_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    folders = {folder(name) for name in edges}
    return {f: {folder(t) for name, targets in edges.items() if folder(name) == f for t in targets} - {f}
            for f in folders}


def test_the_folders_have_no_cycle():
    cycle = find_cycle(folder_graph(graph()))
    assert cycle is None, "import cycle between folders: " + " -> ".join(cycle)


def test_every_folder_has_a_layer():
    layered = {name for layer in LAYERS for name in layer}
    assert {folder(name) for name in graph()} == layered


def test_imports_point_down_the_layers():
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    upward = [f"{name} -> {target}" for name, targets in graph().items() for target in sorted(targets)
              if rank[folder(target)] < rank[folder(name)]]
    assert upward == [], "imports up the layers:\n" + "\n".join(upward)


def test_a_loop_between_folders_is_seen():
    """Two modules in different folders that import each other's folder (not each other) make a loop."""
    edges = {"mlptrain.data.a": {"mlptrain.util.b"}, "mlptrain.util.b": set(), "mlptrain.util.c": {"mlptrain.data.d"},
             "mlptrain.data.d": set()}
    assert find_cycle(edges) is None
    assert find_cycle(folder_graph(edges)) in (["data", "util", "data"], ["util", "data", "util"])


def function_level_imports(path: Path):
    """(line, imported module, the import's block has a comment) of each import inside a function. The
    block is the import with the imports, comments and blank lines right above it in the function."""
    source = path.read_text()
    lines = source.splitlines()
    for function in ast.walk(ast.parse(source, str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        imports = [node for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))]
        starts = {line for node in imports for line in range(node.lineno, node.end_lineno + 1)}
        for node in imports:
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            said = "#" in lines[node.end_lineno - 1]
            line = node.lineno - 1
            while not said and line > function.lineno:
                text = lines[line - 1].strip()
                if text.startswith("#"):
                    said = True
                elif text and line not in starts:
                    break
                line -= 1
            yield node.lineno, module or "", said


def test_only_the_backends_import_numba():
    def imports_numba(node) -> bool:  # at the top or inside a function alike
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        return any(name.split(".")[0] in ("numba", "llvmlite") for name in names)

    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for name, path in modules().items()
             if folder(name) != "backends" for node in ast.walk(ast.parse(path.read_text())) if imports_numba(node)]
    assert found == []


def test_an_import_inside_a_function_says_why():
    """A deferred import keeps start-up fast (numba, onnx, a command's own modules) or it should be at the
    top: a loop it dodges is a loop the graph above would have to see. Its block carries a comment."""
    silent = [f"{path.relative_to(PACKAGE.parent)}:{line} ({module})" for path in modules().values()
              for line, module, said in function_level_imports(path) if not said]
    assert silent == [], "imports inside functions with no comment saying why:\n" + "\n".join(silent)


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_deferred_imports_are_arrows(tmp_path):
    """A cycle through an import inside a function (resume.py once imported train.py so) is seen."""
    module = tmp_path / "resume.py"
    module.write_text("import numpy\n\ndef f():\n    from mlptrain.training.loop import train\n"
                      "    from mlptrain import errors\n")
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
