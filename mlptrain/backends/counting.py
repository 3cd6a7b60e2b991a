"""A third backend for the run's memory plan: it allocates nothing and counts the bytes it was asked for."""

from __future__ import annotations

import math

import numpy as np


class CountingBackend:
    """A backend that allocates nothing: the bytes each `empty`, `zeros` or `to_device` would take are
    added up, and a read-only zero-stride array of the asked shape stands in for the buffer."""

    def __init__(self, backend):
        self.backend, self.kernels, self.name = backend, backend.kernels, backend.name
        self.bytes = 0

    def _stand_in(self, shape, dtype, counted: bool = True):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = np.dtype(dtype)
        self.bytes += math.prod(shape) * dtype.itemsize if counted else 0
        return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=shape, strides=(0,) * len(shape),
                                               writeable=False)

    def empty(self, shape, dtype=np.float32):
        return self._stand_in(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return self._stand_in(shape, dtype)

    def to_device(self, array):
        array = np.asarray(array)
        return self._stand_in(array.shape, array.dtype)

    def resident(self, array):
        """Counted unless the backend keeps it on the device already (a sweep's next trial) or reads the host's
        own array (the cpu backend)."""
        array = np.asarray(array)
        return self._stand_in(array.shape, array.dtype, counted=not self.backend.holds(array))

    def resident_index(self, index):
        return self.resident(index)
