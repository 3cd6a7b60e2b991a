"""host_pages.mapped: the memory api.pinned registers with the driver (no GPU needed to make it)."""

import numpy as np
import pytest

from mlptrain.backends.driver import host_pages


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4097, 100_000, (2 << 20) - 1, 2 << 20, (5 << 20) + 123])
def test_mapped_memory_is_whole_zeroed_pages_of_its_own(nbytes):
    pages = host_pages.mapped(nbytes)
    assert pages.dtype == np.uint8 and pages.flags.writeable and pages.flags.c_contiguous
    assert pages.nbytes >= max(nbytes, 1) and pages.nbytes % host_pages.PAGE == 0
    assert pages.nbytes - max(nbytes, 1) < host_pages.PAGE
    assert pages.ctypes.data % host_pages.PAGE == 0
    if pages.nbytes >= host_pages.HUGE_PAGE:  # starts on a huge page's boundary, so the kernel can back it with them
        assert pages.ctypes.data % host_pages.HUGE_PAGE == 0
    assert not pages.any()
    pages[:] = 7  # every byte its own: writing one mapping leaves the others alone
    other = host_pages.mapped(nbytes)
    assert not other.any()
    assert other.ctypes.data + other.nbytes <= pages.ctypes.data or pages.ctypes.data + pages.nbytes <= other.ctypes.data


@pytest.mark.real_gpu
def test_pinned_memory_takes_a_copy_from_the_device_behind_the_host():
    """api.pinned's memory (registered, or cuMemHostAlloc's where the GPU cannot register): an asynchronous copy from
    the device lands in it, sizes over and under a huge page alike."""
    import ctypes

    from mlptrain.backends.cuda import CudaBackend
    from mlptrain.backends.driver import api

    backend = CudaBackend(own_stream=True)
    if backend.mark() is None:
        pytest.skip("numba's path (MLPTRAIN_CUDA_LAUNCH=numba) pins nothing")
    for count in (300, 3 << 20):
        values = np.arange(count, dtype=np.float32) * 0.5 - 7
        device = backend.to_device(values)
        address, nbytes = api.pinned(values.nbytes)
        assert nbytes == values.nbytes
        landed = np.ctypeslib.as_array((ctypes.c_float * count).from_address(address))
        api.to_host(address, device.pointer, values.nbytes, backend.stream)
        backend.mark().wait()
        np.testing.assert_array_equal(landed, values)
