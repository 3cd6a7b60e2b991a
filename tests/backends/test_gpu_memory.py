"""An out-of-memory error from the CUDA driver becomes one line saying what to change."""

import pytest

from mlptrain.backends.cuda import CudaBackend, gpu_memory_errors
from mlptrain.errors import UserError


class DriverError(Exception):
    """Shaped like numba's CudaAPIError: the CUresult in `code`."""

    def __init__(self, code, msg):
        super().__init__(f"[{code}] Call to cuMemAlloc results in {msg}")
        self.code = code


def test_out_of_memory_is_one_line_naming_what_to_change():
    with pytest.raises(UserError) as caught:
        with gpu_memory_errors(3 * 2**30):
            raise DriverError(2, "CUDA_ERROR_OUT_OF_MEMORY")
    message = str(caught.value)
    assert "\n" not in message and "3,072.0 MiB" in message and "train.batch_size" in message


def test_the_driver_paths_out_of_memory_is_the_same_line():
    from mlptrain.backends.driver.api import DriverError as PathError

    with pytest.raises(UserError, match="ran out of memory allocating 1.0 MiB"):
        with gpu_memory_errors(2**20):
            raise PathError("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY")


def test_other_driver_errors_pass_through():
    with pytest.raises(DriverError):
        with gpu_memory_errors(1):
            raise DriverError(700, "CUDA_ERROR_ILLEGAL_ADDRESS")


def test_the_backend_allocations_say_so(monkeypatch):
    backend = CudaBackend()

    def full(*args, **kwargs):
        raise DriverError(2, "CUDA_ERROR_OUT_OF_MEMORY")

    for method in ("empty", "zeros", "to_device"):  # numba's arrays or the driver path's, whichever it made
        monkeypatch.setattr(backend._device, method, full)
    for allocate in (lambda: backend.empty((1024, 1024)), lambda: backend.zeros((8,)),
                     lambda: backend.to_device(__import__("numpy").ones(4))):
        with pytest.raises(UserError, match="ran out of memory"):
            allocate()
