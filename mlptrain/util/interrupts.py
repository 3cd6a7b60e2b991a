"""A Ctrl-C or SIGTERM that arrives disguised as another error.

Python wraps a KeyboardInterrupt that lands in a class's `__set_name__` (dataclasses, at import) in a
RuntimeError, and a package's import-time `except Exception: raise ImportError(...)` turns that into an
ImportError: an interrupted `import onnx` read as "the onnx package is missing (None is missing)". Whoever
reads an error that may have passed through an import asks here first. Standard library only: the CLI's
signal handling uses it before its own imports.
"""

from __future__ import annotations


def interruption(error: BaseException | None) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (a KeyboardInterrupt) that `error` is or was caused by, if any."""
    for _ in range(100):  # a chain is short; the bound only guards against a cycle
        if error is None or isinstance(error, KeyboardInterrupt):
            return error
        error = error.__cause__ or error.__context__
    return None


def raise_interruption(error: BaseException) -> None:
    """Raise the interrupt behind `error`, where there is one, so that it is reported as the interrupt it is."""
    interrupt = interruption(error)
    if interrupt is not None:
        raise interrupt
