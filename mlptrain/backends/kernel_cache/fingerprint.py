"""A kernel's identity for the on-disk kernel cache: a digest of everything that decides its machine code.

Our kernels are closures built by factories (`_make_conv2d_forward(tile, dtype, size)`), so one
Python function (one qualname, one source line) stands for many kernels that differ only in the
values its closure captured: tile sizes, a dtype's load/store device functions, an activation, an
epilogue. `fingerprint(kernel_function)` walks the function the way the compiler does: its
bytecode and constants, every value its closure captured and every global it names, recursing
into device functions, numba intrinsics and nested code, and digests all of it. Two kernels get
the same fingerprint only when the compiler sees the same program. A value it cannot describe
(an arbitrary object) raises `Unfingerprintable`, and the kernel is then compiled in memory only:
a cache can miss, never run the wrong code.
"""

from __future__ import annotations

import hashlib
import types

import numpy as np

_SCALARS = (type(None), bool, int, float, complex, str, bytes)


class Unfingerprintable(Exception):
    """A value the fingerprint cannot describe, so the kernel is not cached on disk."""


def fingerprint(obj) -> str:
    """The hex sha256 of `obj`'s description (see the module docstring)."""
    return hashlib.sha256(repr(Describer().describe(obj)).encode()).hexdigest()


class Describer:
    """Describes values as nested tuples of plain scalars; functions seen before (recursion through
    globals) become back-references, so cycles terminate and the description stays deterministic.
    A subclass describes functions (`function`) and what is neither a plain value nor a function
    (`other`) its own way: the driver's kernel index (cubins.py) names a kernel by its closure alone."""

    def __init__(self):
        self._seen: dict[int, int] = {}
        self._alive: list = []  # keeps described objects alive so their ids stay unique

    def describe(self, obj):
        if isinstance(obj, _SCALARS):
            return (type(obj).__name__, repr(obj))
        if isinstance(obj, (tuple, list, frozenset, set)):
            items = [self.describe(item) for item in obj]
            return (type(obj).__name__, tuple(sorted(items) if isinstance(obj, (set, frozenset)) else items))
        if isinstance(obj, dict):
            return ("dict", tuple(sorted((repr(k), self.describe(v)) for k, v in obj.items())))
        if isinstance(obj, (np.dtype, np.generic)):
            return (type(obj).__name__, str(obj), repr(obj))
        if isinstance(obj, type) and issubclass(obj, np.generic):
            return ("numpy type", obj.__name__)
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        if isinstance(obj, types.FunctionType):
            return self.function(obj)
        return self.other(obj)

    def other(self, obj):
        if isinstance(obj, types.CodeType):
            return self._code(obj)
        if isinstance(obj, types.BuiltinFunctionType):
            return ("builtin", getattr(obj, "__module__", None), obj.__qualname__)
        return self._numba_object(obj)

    def seen_before(self, fn) -> tuple | None:
        """A back-reference to `fn` when it was described already; else None, and it is marked seen."""
        if id(fn) in self._seen:
            return ("seen", self._seen[id(fn)])
        self._seen[id(fn)] = len(self._seen)
        self._alive.append(fn)
        return None

    def _numba_object(self, obj):
        module = type(obj).__module__ or ""
        if not module.startswith("numba"):
            raise Unfingerprintable(f"cannot fingerprint a {type(obj).__qualname__} ({module})")
        py_func = getattr(obj, "py_func", None)
        if isinstance(py_func, types.FunctionType):  # a device function's (or kernel's) dispatcher
            options = getattr(obj, "targetoptions", {})
            return ("dispatcher", self.function(py_func), self.describe(dict(options)))
        definition = getattr(obj, "_defn", None)
        if isinstance(definition, types.FunctionType):  # an @intrinsic: its typing + codegen function
            return ("intrinsic", self.function(definition))
        # numba types (float32, UniTuple(...)) and the module-level stubs (cuda.grid, cuda.local.array):
        # their text names them completely
        return ("numba", type(obj).__qualname__, str(obj))

    def function(self, fn):
        seen = self.seen_before(fn)
        if seen is not None:
            return seen
        closure = tuple(self.describe(cell.cell_contents) for cell in fn.__closure__ or ())
        defaults = self.describe(fn.__defaults__ or ())
        return ("function", fn.__module__, fn.__qualname__, self._code(fn.__code__), closure, defaults,
                self._globals(fn.__code__, fn.__globals__))

    def _code(self, code):
        consts = tuple(self.describe(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
                       for c in code.co_consts)
        return ("code", code.co_name, code.co_code, consts, code.co_names, code.co_argcount,
                code.co_kwonlyargcount, code.co_flags & 0xFF)

    def _globals(self, code, namespace):
        """The globals `code` (and the code nested in it) names, each described; a module is described
        by its name plus every attribute of it the code names, so `tensor_core.mma` changes the
        fingerprint when `mma` does."""
        names = sorted(_all_names(code))
        described = []
        for name in names:
            if name not in namespace:
                continue
            value = namespace[name]
            if isinstance(value, types.ModuleType):
                attributes = tuple((attr, self.describe(getattr(value, attr))) for attr in names
                                   if attr != name and hasattr(value, attr) and _describable(getattr(value, attr)))
                described.append((name, ("module", value.__name__, attributes)))
            else:
                described.append((name, self.describe(value)))
        return tuple(described)


def _all_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _all_names(const)
    return names


def _describable(value) -> bool:
    """Attributes of a module worth describing: our own functions and constants, not submodules or
    library classes that the code happens to share a name with."""
    if isinstance(value, types.ModuleType) or isinstance(value, type):
        return False
    module = getattr(value, "__module__", None) or type(value).__module__ or ""
    return isinstance(value, _SCALARS) or module.startswith("mlptrain")
