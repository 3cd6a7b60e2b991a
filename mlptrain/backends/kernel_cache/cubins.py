"""Compiled kernels as the driver loads them, found without numba: for each kernel and argument types, its
cubin and entry name, under a key that numba's import is not needed to compute.

numba's own cache entries (cache.py) are keyed by a fingerprint that needs numba's objects, and hold pickled
numba kernels. Beside each, once numba has compiled or loaded a kernel, goes this entry: the cubin for the
GPU's architecture and the kernel's entry name. Its key digests every source file of the package (any edit
makes every entry miss, and numba rebuilds them: cheaper to be sure than to trace what each kernel reaches),
the installed numba, numba-cuda, llvmlite and cuda-bindings, Python's version, the GPU's compute capability,
every NUMBA_ setting in the environment, the kernel's qualified name and what its closure captured (tile
sizes, dtypes, the device functions a factory chose) and the argument types. A value the description cannot
name raises Unfingerprintable: that kernel then goes through numba every time, never the wrong cubin.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import types
from pathlib import Path

import numpy as np

from mlptrain.backends.kernel_cache import numba_names
from mlptrain.backends.kernel_cache.fingerprint import Unfingerprintable
from mlptrain.backends.kernel_cache.numba_names import Deferred, Name

PACKAGE = Path(__file__).resolve().parents[2]  # mlptrain/
_DISTRIBUTIONS = re.compile(r"(numba|numba_cuda|llvmlite|cuda_bindings)-([^-]+)\.dist-info")
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


@functools.cache
def package_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def versions() -> tuple:
    """The installed compiler's distributions, read from their dist-info folders' names (importlib.metadata
    takes 40 ms to say the same)."""
    found = set()
    for folder in dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found |= {m.groups() for m in map(_DISTRIBUTIONS.fullmatch, names) if m}
    return tuple(sorted(found))


def environment(capability: tuple) -> tuple:
    settings = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("NUMBA_")))
    return (package_digest(), versions(), sys.version_info[:3], tuple(capability), settings)


def identity(py_func, options: dict) -> str:
    """What tells this kernel from the others its source makes (a factory's closure), as text."""
    describe = _Describer().describe
    return repr((py_func.__module__, py_func.__qualname__, describe(py_func), describe(dict(options))))


def key(identity_text: str, typenames: tuple, capability: tuple) -> str:
    text = repr(("driver launch", identity_text, typenames, environment(capability)))
    return hashlib.sha256(text.encode()).hexdigest()


def entry(payload: bytes) -> tuple[str, bytes] | None:
    """(entry name, cubin) from a stored payload; None when it is not one."""
    name, newline, cubin = payload.partition(b"\n")
    if not newline or not cubin or not name.isascii():
        return None
    return name.decode(), cubin


def payload(name: str, cubin: bytes) -> bytes:
    return name.encode() + b"\n" + bytes(cubin)


def launchable(kernel, capability: tuple) -> tuple[str, bytes] | None:
    """A numba kernel's (entry name, cubin), when the driver path can launch it as numba would: no cooperative
    launch, no shared-memory carve-out, no module set-up, no debug exceptions to read back."""
    library = kernel._codelibrary
    if (kernel.cooperative or kernel.debug or getattr(kernel, "shared_memory_carveout", None) is not None
            or getattr(library, "_setup_functions", None) or not getattr(library, "_entry_name", None)):
        return None
    cubin = library.get_cubin(cc=tuple(capability))
    if getattr(cubin, "code_type", "cubin") != "cubin":
        return None
    cubin = getattr(cubin, "code", cubin)  # numba-cuda 0.30 hands out cuda.core's ObjectCode, older ones bytes
    return (library._entry_name, bytes(cubin)) if isinstance(cubin, (bytes, bytearray)) else None


class _Describer:
    """A closure's values as nested tuples of plain scalars. A numba object made from a Name or Deferred is
    described as what it came from, so a kernel made before numba's import and one made after get one key."""

    def __init__(self):
        self._seen: dict[int, int] = {}
        self._alive: list = []

    def describe(self, obj):
        if isinstance(obj, _SCALARS):
            return (type(obj).__name__, repr(obj))
        if isinstance(obj, (tuple, list)):
            return (type(obj).__name__, tuple(self.describe(item) for item in obj))
        if isinstance(obj, dict):
            return ("dict", tuple(sorted((repr(k), self.describe(v)) for k, v in obj.items())))
        if isinstance(obj, (np.dtype, np.generic)):
            return (type(obj).__name__, str(obj), repr(obj))
        if isinstance(obj, type) and issubclass(obj, np.generic):
            return ("numpy type", obj.__name__)
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        if isinstance(obj, Name):
            return ("numba", obj.path)
        if isinstance(obj, Deferred):
            return ("deferred", self.describe(obj.function), self.describe(obj.args), self.describe(obj.kwargs))
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        origin = numba_names.ORIGINS.get(id(obj))
        if origin is not None and origin[1] is obj:
            return self.describe(origin[0])
        raise Unfingerprintable(f"cannot describe a {type(obj).__qualname__} for the driver's kernel index")

    def _function(self, fn):
        if id(fn) in self._seen:
            return ("seen", self._seen[id(fn)])
        self._seen[id(fn)] = len(self._seen)
        self._alive.append(fn)
        closure = []
        for cell in fn.__closure__ or ():
            try:
                closure.append(self.describe(cell.cell_contents))
            except ValueError:  # an empty cell
                closure.append(("empty",))
        return ("function", fn.__module__, fn.__qualname__, tuple(closure), self.describe(fn.__defaults__ or ()))
