"""The two backends behind one small interface.

A `Backend` allocates arrays on its device, moves arrays between host and
device, and exposes its kernel package as `kernels` (numba_kernels or
numpy_kernels: same modules, same function names and signatures).
Only `get_backend` imports numba, so the CPU path never pays for CUDA.
"""

from __future__ import annotations

import numpy as np

from mlptrain.errors import UserError


class CpuBackend:
    name = "cpu"

    def __init__(self):
        from mlptrain import numpy_kernels

        self.kernels = numpy_kernels
        self.device_name = "cpu (NumPy)"

    def empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def to_device(self, array):
        return np.ascontiguousarray(array).copy()

    def to_host(self, array):
        return np.array(array, copy=True)

    def copy_from_host(self, dst, src):
        dst[...] = src

    def synchronize(self):
        pass

    def capture(self, record):
        """A replayable recording of the launches `record()` makes, or None where there is none (here)."""
        return None


class CudaBackend:
    name = "cuda"

    def __init__(self):
        import numba
        from numba import cuda

        from mlptrain import numba_kernels

        # small MLP grids are launch-bound by design; numba's occupancy warning would print every run
        numba.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
        self._cuda = cuda
        self.kernels = numba_kernels
        raw = getattr(cuda.get_current_device(), "name", "CUDA simulator")
        self.device_name = raw.decode() if isinstance(raw, bytes) else str(raw)

    def empty(self, shape, dtype=np.float32):
        return self._cuda.device_array(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return self._cuda.to_device(np.zeros(shape, dtype))

    def to_device(self, array):
        return self._cuda.to_device(np.ascontiguousarray(array))

    def to_host(self, array):
        return array.copy_to_host()

    def copy_from_host(self, dst, src):
        dst.copy_to_device(np.ascontiguousarray(src, dtype=dst.dtype))

    def synchronize(self):
        self._cuda.synchronize()

    def capture(self, record):
        """The launches `record()` makes, captured (not run) as a CUDA graph whose `replay()` queues them all
        at once; None on the simulator."""
        from mlptrain.numba_kernels import streams

        return streams.Graph(record) if streams.graphs_supported() else None


def cuda_usable() -> bool:
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:  # a broken driver or toolkit means: not usable
        return False


def get_backend(name: str):
    """`auto` picks CUDA when a GPU is usable, else the CPU."""
    if name == "cpu":
        return CpuBackend()
    if name == "auto":
        return CudaBackend() if cuda_usable() else CpuBackend()
    if name == "cuda":
        if not cuda_usable():
            raise UserError("backend=cuda: no usable NVIDIA GPU or CUDA driver was found; use backend=cpu or backend=auto")
        return CudaBackend()
    raise UserError(f"backend: '{name}' is not one of auto, cuda, cpu")
