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
from pathlib import Path

from mlptrain.backends.kernel_cache import numba_names
from mlptrain.backends.kernel_cache.fingerprint import Describer, Unfingerprintable
from mlptrain.backends.kernel_cache.numba_names import Deferred, Name

PACKAGE = Path(__file__).resolve().parents[2]  # mlptrain/
_DISTRIBUTIONS = re.compile(r"(numba|numba_cuda|llvmlite|cuda_bindings)-([^-]+)\.dist-info")


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


def fingerprint_early() -> None:
    """Digest the package's sources and find the compiler's versions now (20-40 ms, once a process), on a
    thread that waits for the GPU's context, rather than in the first session's kernel lookup."""
    package_digest()
    versions()


def environment(capability: tuple) -> tuple:
    settings = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("NUMBA_")))
    return (package_digest(), versions(), sys.version_info[:3], tuple(capability), settings)


def identity(py_func, options: dict) -> str:
    """What tells this kernel from the others its source makes (a factory's closure), as text."""
    describe = _ClosureDescriber().describe
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


class _ClosureDescriber(Describer):
    """A kernel by its module, name, first line, closure and defaults (the package's digest covers its code). A numba
    object made from a Name or Deferred is described as what it came from, so a kernel made before numba's
    import and one made after get one key."""

    def function(self, fn):
        seen = self.seen_before(fn)
        if seen is not None:
            return seen
        closure = []
        for cell in fn.__closure__ or ():
            try:
                closure.append(self.describe(cell.cell_contents))
            except ValueError:  # an empty cell
                closure.append(("empty",))
        # the first line too: a factory may define one name in two branches (tiles.dense_operand's `fetch`), two
        # functions of one qualname and one closure that must not share a cubin
        return ("function", fn.__module__, fn.__qualname__, fn.__code__.co_firstlineno, tuple(closure),
                self.describe(fn.__defaults__ or ()))

    def other(self, obj):
        if isinstance(obj, Name):
            return ("numba", obj.path)
        if isinstance(obj, Deferred):
            return ("deferred", self.describe(obj.function), self.describe(obj.args), self.describe(obj.kwargs))
        origin = numba_names.ORIGINS.get(id(obj))
        if origin is not None and origin[1] is obj:
            return self.describe(origin[0])
        raise Unfingerprintable(f"cannot describe a {type(obj).__qualname__} for the driver's kernel index")
