"""Every kernel may be launched before the kernel ahead of it in the stream has ended (numba_kernels.grid_order):
that is safe only where it waits for that kernel before it touches global memory, so each kernel's first
statement must be the wait. No GPU needed."""

import ast
from pathlib import Path

import mlptrain

PACKAGE = Path(mlptrain.__file__).parent


def kernels() -> list[tuple[str, ast.FunctionDef]]:
    """(file, function) of every function of the package declared as a kernel (`@kernel_cache.jit...`)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    ast.unparse(d).split("(")[0] in ("kernel_cache.jit", "kernels.jit", "jit") for d in node.decorator_list):
                found.append((str(path.relative_to(PACKAGE)), node))
    return found


def first_statement(function: ast.FunctionDef):
    body = function.body
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
    return body[1] if docstring else body[0]


def test_every_kernel_first_waits_for_the_grid_before_it():
    found = kernels()
    assert len(found) >= 45  # every kernel module was read (47 kernels when this test was written)
    late = [f"{path}: {function.name}" for path, function in found
            if ast.unparse(first_statement(function)) != "after_previous_grid()"]
    assert not late, f"kernels whose first statement is not after_previous_grid(): {late}"

