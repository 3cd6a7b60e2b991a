"""The thread's GPU as the launchers ask about it, from the driver path (backends.driver) or from numba,
whichever launches this process's kernels (kernel_cache.numba_names)."""

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, config, cuda


def device() -> int:
    """The index of the GPU current in this thread (0 on the simulator)."""
    if DEFERRED:
        # imported on first use: the driver's bindings load only on a GPU
        from mlptrain.backends.driver import api

        return api.current_device() or 0
    return getattr(cuda.get_current_device(), "id", 0)


def capability() -> tuple:
    """The current GPU's compute capability."""
    if DEFERRED:
        # imported on first use: the driver's bindings load only on a GPU
        from mlptrain.backends.driver import api

        return api.capability(device())
    return tuple(cuda.get_current_device().compute_capability)


SIMULATED_CAPABILITY = (8, 0)  # the simulator emulates the tensor cores' mma as a GPU of compute capability 8.0 runs it


def kernel_capability() -> tuple:
    """The compute capability that decides which kernels a pass runs (the tensor cores' from 8.0; older GPUs keep
    the CUDA cores'): the current GPU's, SIMULATED_CAPABILITY on the simulator. Asked each time (the driver or numba
    keeps it): a sweep's threads may each run on a different GPU."""
    return SIMULATED_CAPABILITY if config.ENABLE_CUDASIM else capability()


def to_device(host):
    """A device copy of a host array, of the kind this process launches with."""
    if DEFERRED:
        # imported on first use: the driver's bindings load only on a GPU
        from mlptrain.backends.driver.arrays import DeviceArray

        array = DeviceArray.allocate(host.shape, host.dtype)
        array.copy_to_device(host)
        return array
    return cuda.to_device(host)
