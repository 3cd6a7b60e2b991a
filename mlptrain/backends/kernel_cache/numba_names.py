"""numba's names as the kernel modules use them, importable without importing numba (0.6 s).

A process whose kernels are all in the cache launches them through the driver (backends.driver) and never
needs numba. So the kernel modules take `cuda`, `float32`, `types`... from here: on that path (`DEFERRED`)
each is a `Name` standing for the numba object, and `cuda.jit(...)(fn)` and `kernel_cache.device(fn)` are
`Deferred` calls. Kernel bodies only name them; numba reads them when it compiles, so before it does,
`bind(fn)` imports numba and puts the real objects where the kernel's code and closures find them. Host code
may use the numeric types to cast (`float32(x)` is numpy's, as numba's own types give) and `config`; any
other numba call on that path raises, naming it.

With the CUDA simulator, or MLPTRAIN_CUDA_LAUNCH=numba, or without `cuda.bindings`, these are numba's own
objects and nothing is deferred: every launch goes through numba, as it always did.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import types as pytypes

import numpy as np

from mlptrain.util.interrupts import raise_interruption

__all__ = ["DEFERRED", "SIMULATOR", "LAUNCH_ENV", "bindings_installed", "Name", "Deferred", "resolve", "bind", "cuda", "types",
           "libdevice", "config", "float32", "float64", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "complex64"]

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
LAUNCH_ENV = "MLPTRAIN_CUDA_LAUNCH"  # "numba": every launch through numba (the way before the driver path)


def bindings_installed() -> bool:
    """Whether the CUDA driver's Python bindings (`cuda.bindings`, numba-cuda's) are there, without importing them."""
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ImportError as err:  # no `cuda` package at all
        raise_interruption(err)
        return False


DEFERRED = not SIMULATOR and os.environ.get(LAUNCH_ENV, "").strip().lower() != "numba" and bindings_installed()
_CASTS = ("float32", "float64", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "complex64")


class Name:
    """A numba object by its path (`cuda.grid`), imported when something needs the real one."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Name(f"{self.path}.{attr}")

    def __call__(self, *args, **kwargs):
        if self.path in _CASTS:  # host code casting a launch argument: numba's types give numpy's scalars
            return getattr(np, self.path)(*args, **kwargs)
        if self.path == "cuda.jit":
            return Deferred(self, args, kwargs)
        raise RuntimeError(f"numba's {self.path} called before numba was imported (the driver launch path)")

    def __bool__(self):
        raise TypeError(f"numba's {self.path} has no truth value before numba is imported")

    def __repr__(self):
        return f"numba.{self.path}"


class Deferred:
    """`function(*args, **kwargs)` made when numba is imported, once (every user gets the same object)."""

    __slots__ = ("function", "args", "kwargs", "value")

    def __init__(self, function, args=(), kwargs=None):
        self.function, self.args, self.kwargs, self.value = function, tuple(args), dict(kwargs or {}), None

    def __call__(self, *args, **kwargs):
        return Deferred(self, args, kwargs)

    def __bool__(self):
        return True

    def __repr__(self):
        return f"Deferred({self.function!r}, {self.args!r}, {self.kwargs!r})"


ORIGINS: dict[int, tuple] = {}  # id(a real numba object) -> (the Name or Deferred it came from, the object)


def resolve(value):
    """The real object a Name or Deferred stands for (numba imported now); anything else unchanged."""
    if isinstance(value, Name):
        real = importlib.import_module("numba")
        for i, part in enumerate(value.path.split(".")):
            if not hasattr(real, part):  # a submodule not imported yet (cuda.libdevice)
                importlib.import_module("numba." + ".".join(value.path.split(".")[:i + 1]))
            real = getattr(real, part)
    elif isinstance(value, Deferred):
        if value.value is None:
            function = resolve(value.function)
            value.value = function(*(resolve(a) for a in value.args), **{k: resolve(v) for k, v in value.kwargs.items()})
        real = value.value
    else:
        return value
    ORIGINS.setdefault(id(real), (value, real))
    return real


def bind(function, seen: set | None = None) -> None:
    """Put the real numba objects wherever `function`'s code can reach a Name or Deferred: the globals it (or
    code nested in it) names, the attributes of our modules it names, its closure and defaults; then the same
    for every device function reached."""
    seen = set() if seen is None else seen
    if id(function) in seen:
        return
    seen.add(id(function))
    names = _all_names(function.__code__)
    namespace = function.__globals__
    for name in names:
        if name in namespace:
            namespace[name] = _bound(namespace[name], names, seen)
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        bound = _bound(value, names, seen)
        if bound is not value:
            cell.cell_contents = bound
    if function.__defaults__:
        function.__defaults__ = tuple(_bound(v, names, seen) for v in function.__defaults__)


def _bound(value, names, seen):
    if isinstance(value, (Name, Deferred)):
        value = resolve(value)
    elif isinstance(value, _Config):
        value = importlib.import_module("numba").config
    if isinstance(value, tuple):
        items = tuple(_bound(v, names, seen) for v in value)
        return value if all(a is b for a, b in zip(items, value)) else items
    py_func = getattr(value, "py_func", None)
    if isinstance(value, pytypes.FunctionType):
        bind(value, seen)
    elif isinstance(py_func, pytypes.FunctionType):  # a device function's dispatcher
        bind(py_func, seen)
    elif isinstance(value, pytypes.ModuleType) and value.__name__.startswith("mlptrain"):
        for attr in names:
            if attr in vars(value):
                setattr(value, attr, _bound(vars(value)[attr], names, seen))
    return value


def _all_names(code) -> set:
    names = set(code.co_names) | set(code.co_freevars)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _all_names(const)
    return names


class _Config:
    """numba.config's one setting the kernel modules read at import."""

    ENABLE_CUDASIM = False


if DEFERRED:
    cuda, types, libdevice = Name("cuda"), Name("types"), Name("cuda.libdevice")
    float32, float64, int32, int64 = Name("float32"), Name("float64"), Name("int32"), Name("int64")
    uint8, uint16, uint32, uint64, complex64 = Name("uint8"), Name("uint16"), Name("uint32"), Name("uint64"), Name("complex64")
    config = _Config()
else:
    # imported here, not at the top: only this branch needs numba now
    from numba import complex64, config, cuda, float32, float64, int32, int64, types, uint8, uint16, uint32, uint64

    libdevice = None if SIMULATOR else importlib.import_module("numba.cuda.libdevice")
