"""The CPU backend: NumPy arrays on the host and the NumPy kernel set (numpy_kernels/)."""

from __future__ import annotations

import contextlib

import numpy as np

from mlptrain.backends import numpy_kernels
from mlptrain.backends.host_copies import Ready
from mlptrain.util.host_memory import host_available


class CpuBackend:
    """Satisfies `mlptrain.backends.protocol.Backend` with NumPy arrays; its device is the host."""

    name = "cpu"
    copies_lane_views = True  # NumPy views

    def __init__(self, fallback: str | None = None):
        self.kernels = numpy_kernels
        self.device_name = "cpu (NumPy)"
        self.fallbacks = [fallback] if fallback else []  # why this backend runs instead of the one asked for

    def empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def zero(self, array) -> None:
        array[...] = 0

    def to_device(self, array):
        return np.ascontiguousarray(array).copy()

    def resident(self, array):
        """The host array itself, read-only: the device is the host, and nothing writes it."""
        view = np.ascontiguousarray(array).view()
        view.flags.writeable = False
        return view

    def resident_index(self, index):
        return self.resident(index)

    def holds(self, array) -> bool:
        return True  # resident() reads the host's own array

    def to_host(self, array):
        return np.array(array, copy=True)

    def copy_from_host(self, dst, src):
        dst[...] = src

    copy_from_host_later = copy_from_host  # nothing runs behind the host's back here

    def synchronize(self):
        pass

    def mark(self):
        """None: every launch has run when it returns."""
        return None

    def copy(self, dst, src):
        dst[...] = src

    @contextlib.contextmanager
    def urgent(self, after=None):
        """Nothing to hurry: every launch runs when it is made."""
        yield

    def overtaking(self, after):
        """No stream to go ahead on (Backend.overtaking)."""
        return None

    def rejoin(self, view) -> None:
        pass

    @contextlib.contextmanager
    def beside(self):
        """Every launch runs when it is made: nothing runs beside another."""
        yield

    def join_beside(self) -> None:
        pass

    def to_host_after(self, array, mark):
        return self.to_host(array)

    def to_host_later(self, arrays):
        return Ready([self.to_host(array) for array in arrays])

    def reserve_host_copies(self, *copies) -> None:
        pass

    def free_bytes(self) -> int | None:
        """Bytes the device (here the host) can still give; None where the system will not say."""
        return host_available()

    def capture(self, record):
        """A replayable recording of the launches `record()` makes, or None where there is none (here)."""
        return None

    def graphs_unavailable(self) -> str | None:
        """Why `capture` records nothing (None: it records)."""
        return "the cpu backend launches no CUDA kernels"

    def start_compilers(self):
        """NumPy needs no compiling."""
