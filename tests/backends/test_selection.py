"""`backend: auto` on a machine without a GPU: the driver library is asked first (milliseconds), and numba
is not imported to find out."""

import ctypes
import sys
import time

import pytest

from mlptrain.backends import cuda
from mlptrain.backends.cuda import cuda_unusable_reason, driver_unusable_reason, gpu_count
from mlptrain.backends.selection import get_backend


class FakeDriver:
    def __init__(self, init_status=0, count=0):
        self.init_status, self.count = init_status, count

    def cuInit(self, flags):
        return self.init_status

    def cuDeviceGetCount(self, pointer):
        pointer._obj.value = self.count
        return 0

    def cuDeviceGet(self, pointer, ordinal):  # the early context (make_context_early): refused here
        return 101  # CUDA_ERROR_INVALID_DEVICE


@pytest.fixture
def linux_without_simulator(monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setitem(sys.modules, "numba", None)  # importing numba now fails: the probe must not need it


def missing(name):
    raise OSError(f"{name}: cannot open shared object file")


@pytest.mark.parametrize("driver, reason", [
    (missing, "no CUDA driver: libcuda.so.1 not found"),
    (lambda name: FakeDriver(init_status=100), "the CUDA driver failed to start (cuInit error 100)"),
    (lambda name: FakeDriver(count=0), "the CUDA driver sees no GPU"),
])
def test_no_gpu_is_found_without_numba(monkeypatch, linux_without_simulator, driver, reason):
    monkeypatch.setattr(ctypes, "CDLL", driver)
    start = time.perf_counter()
    assert driver_unusable_reason() == reason and cuda_unusable_reason() == reason
    assert time.perf_counter() - start < 0.5
    backend = get_backend("auto")
    assert backend.name == "cpu" and backend.fallbacks == [f"backend auto: no usable GPU ({reason}); running on the CPU"]


def test_a_driver_with_a_gpu_leaves_the_answer_to_numba(monkeypatch, linux_without_simulator):
    """Where numba launches the kernels (MLPTRAIN_CUDA_LAUNCH=numba, or no cuda.bindings), numba must work."""
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver(count=1))
    monkeypatch.setattr(cuda, "_driver_path", lambda: False)
    assert driver_unusable_reason() is None
    reason = cuda_unusable_reason()  # numba cannot be imported here: its failure is the answer
    assert reason is not None and "numba" in reason


def test_a_driver_with_a_gpu_is_the_answer_where_it_launches(monkeypatch, linux_without_simulator):
    """The driver path (cuda.bindings) launches cached kernels without numba: a GPU the driver offers is usable."""
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver(count=1))
    monkeypatch.setattr(cuda, "_driver_path", lambda: True)
    assert cuda_unusable_reason() is None


def test_the_simulator_is_numbas_to_answer(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert driver_unusable_reason() is None


@pytest.mark.parametrize("count", [1, 2, 8])
def test_the_gpus_are_counted_by_the_driver(monkeypatch, linux_without_simulator, count):
    """A sweep's parent counts GPUs to place its workers: the driver answers, numba is not imported."""
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver(count=count))
    monkeypatch.setitem(sys.modules, "numba", None)  # importing numba here would raise
    assert gpu_count() == count


def test_a_driver_without_gpus_counts_none(monkeypatch, linux_without_simulator):
    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert gpu_count() == 0
