"""Launching a compiled numba kernel without numba: its parameters packed the way numba's launcher packs them.

numba passes an array as 5 + 2 ndim parameters (meminfo, parent, element count, item size, data pointer, the
shape, the strides in bytes) and a scalar as its own C type; a tuple as its items, one after another. Each
parameter goes in an 8-byte slot here (none is wider), and the driver gets an array of pointers to the slots.
`typename` names an argument's type the way numba's `typeof` does, so one launch and the compiled kernel it
needs are found without numba."""

from __future__ import annotations

import ctypes
import functools
import os
import struct

import numpy as np

from mlptrain.backends.driver import api
from mlptrain.backends.driver.arrays import DeviceArray

_SCALARS = {"bool": "?7x", "int8": "b7x", "uint8": "B7x", "int16": "h6x", "uint16": "H6x", "int32": "i4x",
            "uint32": "I4x", "int64": "q", "uint64": "Q", "float32": "f4x", "float64": "d"}


# Kernels launched early where the GPU allows it; MLPTRAIN_EARLY_LAUNCH=0 launches each after the last has ended.
EARLY = os.environ.get("MLPTRAIN_EARLY_LAUNCH", "1").strip() != "0"


class Unlaunchable(TypeError):
    """An argument this path cannot pass (numba's launcher then takes the launch)."""


def typename(value) -> str:
    """numba's name for the type it would give `value` as a kernel argument."""
    kind = type(value)
    if kind is DeviceArray:
        return value.typename
    if kind is bool or kind is np.bool_:
        return "bool"
    if kind is int:
        return "int64"
    if kind is float:
        return "float64"
    if isinstance(value, np.generic) and value.dtype.name in _SCALARS:
        return value.dtype.name
    if kind is tuple:
        return "(" + ", ".join(typename(item) for item in value) + ",)"
    raise Unlaunchable(f"a {kind.__name__} kernel argument")


def values(args) -> list:
    """The slot values of `args`, in parameter order."""
    out = []
    for value in args:
        if type(value) is DeviceArray:
            out += value.parameters
        elif type(value) is tuple:
            out += values(value)
        else:
            out.append(value.item() if isinstance(value, np.generic) else value)
    return out


@functools.cache
def layout(typenames: tuple) -> struct.Struct:
    """The slots of one signature (cached: a kernel is launched with few)."""
    return struct.Struct("<" + "".join(_slots(name) for name in typenames))


def _slots(name: str) -> str:
    if name.startswith("array("):
        ndim = int(name.rsplit(", ", 2)[1][:-1])
        return "q" * (5 + 2 * ndim)
    if name.startswith("("):
        return "".join(_slots(item) for item in _split(name[1:-2]))
    return _SCALARS[name]


def _split(items: str) -> list[str]:
    """The top-level items of a tuple type's text."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(items):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append(items[start:i].strip())
            start = i + 1
    if items[start:].strip():
        out.append(items[start:].strip())
    return out


def launch(function, typenames: tuple, args, grid, block, stream, cluster=None) -> None:
    """Queue `function` (a CUfunction of a numba kernel compiled for `typenames`) with `args`; early (see
    api.launch) where EARLY and the GPU allow it: every kernel of the package opens with
    numba_kernels.grid_order's wait. `cluster`: the dimensions of its thread-block clusters (api.launch)."""
    packed = layout(typenames).pack(*values(args))
    slots = ctypes.create_string_buffer(packed, len(packed))
    base = ctypes.addressof(slots)
    pointers = (ctypes.c_void_p * (len(packed) // 8))(*range(base, base + len(packed), 8))
    api.launch(function, _dim3(grid), _dim3(block), stream, ctypes.addressof(pointers), early(),
               None if cluster is None else _dim3(cluster))


def early() -> bool:
    """Whether this thread's GPU gets its launches early: EARLY, on a GPU and driver that allow it."""
    return EARLY and api.dependent_launches(api.current_device())


def _dim3(dim) -> tuple:
    dim = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(int(n) for n in dim) + (1,) * (3 - len(dim))
