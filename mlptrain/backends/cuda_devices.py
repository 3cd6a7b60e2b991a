"""The two paths a CudaBackend's arrays, copies, marks and streams take (mlptrain.backends.cuda): the driver's
(`DriverDevice`, no numba: a run whose kernels are all cached never imports it) and numba's (`NumbaDevice`: the
simulator, and MLPTRAIN_CUDA_LAUNCH=numba). Each imports its library when it is made, so the CPU path loads
neither."""

from __future__ import annotations

import os

import numpy as np

from mlptrain.errors import UserError


# Launches that may run beside the ones after them (CudaBackend.beside) on a second stream; MLPTRAIN_BESIDE=0 keeps
# them in order on the one stream (the same kernels and bits: a check, and a measurement's other half).
BESIDE = os.environ.get("MLPTRAIN_BESIDE", "1").strip() != "0"


class DriverDevice:
    """A CudaBackend's GPU, arrays and stream through the driver (no numba)."""

    copies_lane_views = True  # DeviceArray.copy_into

    def __init__(self, device: int | None, own_stream: bool):
        # imported here, not at the top: the CPU path never loads the driver's bindings
        from mlptrain.backends.driver import api
        from mlptrain.backends.driver.arrays import DeviceArray

        self._api, self._array = api, DeviceArray
        try:
            device = (api.current_device() or 0) if device is None else device
            api.use_device(device)
            self.stream = api.Stream() if own_stream else 0
            self.name = api.device_name(device)
            self._side = self._urgent = self._beside = None  # to_host_after's, urgent's, beside's: made on first use
        except api.DriverError as err:  # a GPU the driver lists but will not give (busy in exclusive mode, failing)
            raise UserError(f"GPU {device} cannot be used: {err}; free it (nvidia-smi shows who holds it) "
                            "or use backend=cpu") from None

    def empty(self, shape, dtype):
        return self._array.allocate(shape, dtype)

    def zeros(self, shape, dtype):
        array = self._array.allocate(shape, dtype)
        self.zero(array, self.stream)
        return array

    def zero(self, array, stream) -> None:
        """A memset of the array's bytes (a packed lane's row: one slab row, contiguous)."""
        if not array.contiguous:
            raise ValueError(f"zeroing a strided {array.shape} device array")
        self._api.zero(array.pointer, array.nbytes, stream)

    def to_device(self, host):
        array = self._array.allocate(host.shape, host.dtype)
        array.copy_to_device(host, stream=self.stream)
        return array

    def synchronize(self):
        """Every queued launch of the context (a stream's own wait is the backend's)."""
        self._api.synchronize()

    def mark(self, stream):
        return self._api.Event().record(stream)

    def urgent_stream(self):
        """A stream of the highest priority, made on first use."""
        if self._urgent is None:
            self._urgent = self._api.Stream(priority=self._api.highest_priority())
        return self._urgent

    def beside_stream(self):
        """A second launch stream (non-blocking: work from the legacy default stream may run beside it too), made
        on first use; None with MLPTRAIN_BESIDE=0 (CudaBackend.beside)."""
        if not BESIDE:
            return None
        if self._beside is None:
            self._beside = self._api.side_stream()
        return self._beside

    def follow(self, stream, leader) -> None:
        """Work queued on `stream` from now on waits for what `leader` has queued so far."""
        self.wait_for(stream, self.mark(leader))

    def wait_for(self, stream, mark) -> None:
        self._api.wait_for(stream, mark)

    def copy(self, dst, src, stream):
        self._api.copy(dst.pointer, src.pointer, dst.nbytes, stream)

    def to_host_after(self, array, mark):
        """Copied on a stream of its own that waits for `mark` alone (a copy into pageable host memory returns
        once it is done)."""
        if self._side is None:
            self._side = self._api.side_stream()
        self._api.wait_for(self._side, mark)
        host = array.copy_to_host(stream=self._side)
        self._side.synchronize()
        return host

    def to_host_later(self, arrays, stream):
        """The copies staged in pinned memory (host_copies.stage), or None."""
        # imported on first use: only checkpoints taken on a GPU need it
        from mlptrain.backends import host_copies

        return host_copies.stage(host_copies.pool(self._api.pinned), arrays, stream, self.mark)

    def copy_from_host_later(self, dst, src, stream) -> bool:
        """The copy queued from pinned memory (host_copies.send); False where the pool gave none."""
        # imported on first use: only a GPU's runs need it
        from mlptrain.backends import host_copies

        return host_copies.send(host_copies.pool(self._api.pinned), dst, src, stream, self.mark)

    def reserve_host_copies(self, copies) -> None:
        # imported on first use: only checkpoints taken on a GPU need it
        from mlptrain.backends import host_copies

        api, context = self._api, self._api.current_context()

        def allocate(size):
            api.set_current(context)  # the reserving thread's: the driver pins memory for a context
            return api.pinned(size)

        host_copies.pool(api.pinned).reserve([host_copies.layout(arrays)[1] for arrays in copies], allocate)

    def free_bytes(self) -> int:
        return self._api.memory_info()[0]


class NumbaDevice:
    """A CudaBackend's GPU, arrays and stream through numba (the simulator, MLPTRAIN_CUDA_LAUNCH=numba)."""

    copies_lane_views = False

    def __init__(self, device: int | None, own_stream: bool):
        # here, not at the top: the CPU path and `backend: auto` without a GPU never import numba (seconds)
        import numba
        from numba import cuda

        # small MLP grids are launch-bound by design; numba's occupancy warning would print every run
        numba.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
        self._cuda = cuda
        if device is not None:
            cuda.select_device(device)
        self.stream = cuda.stream() if own_stream else 0
        raw = getattr(cuda.get_current_device(), "name", "CUDA simulator")
        self.name = raw.decode() if isinstance(raw, bytes) else str(raw)

    def empty(self, shape, dtype):
        return self._cuda.device_array(shape, dtype, stream=self.stream)

    def zeros(self, shape, dtype):
        return self._cuda.to_device(np.zeros(shape, dtype), stream=self.stream)

    def to_device(self, host):
        return self._cuda.to_device(host, stream=self.stream)

    def synchronize(self):
        """Every queued launch of the context (a stream's own wait is the backend's)."""
        self._cuda.synchronize()

    def mark(self, stream):
        return None

    def urgent_stream(self):
        return None

    def beside_stream(self):
        return None  # numba's launches and marks stay on the one stream

    def copy(self, dst, src, stream):
        dst.copy_to_device(src, stream=stream)

    def zero(self, array, stream) -> None:
        array.copy_to_device(np.zeros(array.shape, array.dtype), stream=stream)

    def to_host_later(self, arrays, stream):
        return None  # copied at once (CudaBackend.to_host): numba's pinned arrays are not worth its path

    def copy_from_host_later(self, dst, src, stream) -> bool:
        return False  # copied at once (CudaBackend.copy_from_host), as to_host_later

    def reserve_host_copies(self, copies) -> None:
        pass

    def free_bytes(self) -> int:
        free, _ = self._cuda.current_context().get_memory_info()
        return int(free)
