"""A GPU's context is started early, through the driver library, so that it is made while numba imports:
once per GPU, only for the GPUs the process will use, and never where the driver offers no GPU."""

import ctypes
import sys
import threading

import pytest

from mlptrain.backends.driver import early
from mlptrain.backends.selection import get_backend
from mlptrain.sweep.gpu_processes import PROCESS_PER_GPU_ENV
from mlptrain.sweep.threads import make_contexts_early


class FakeDriver:
    def __init__(self, count):
        self.count, self.retained = count, []

    def cuInit(self, flags):
        return 0

    def cuDeviceGetCount(self, pointer):
        pointer._obj.value = self.count
        return 0

    def cuDeviceGet(self, pointer, ordinal):
        if ordinal >= self.count:
            return 101  # CUDA_ERROR_INVALID_DEVICE
        pointer._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, pointer, device):
        self.retained.append(device.value)
        return 0


@pytest.fixture
def driver(monkeypatch):
    """A driver with two GPUs, on Linux without the simulator; no context started yet in this process."""
    fake = FakeDriver(count=2)
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.delenv(PROCESS_PER_GPU_ENV, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    monkeypatch.setattr(early, "CONTEXTS_STARTED", set())
    return fake


def retained(fake):
    for thread in threading.enumerate():
        if thread.name.startswith("cuda-context-"):
            thread.join(5)
    return sorted(fake.retained)


def test_a_gpu_context_is_started_once(driver):
    early.make_context_early(None)  # the first visible GPU
    early.make_context_early(0)
    assert retained(driver) == [0]


@pytest.mark.parametrize("workers, per_process, expected", [(1, False, [0]), (2, False, [0, 1]), (5, False, [0, 1]),
                                                             (4, True, [0])])
def test_a_sweep_starts_the_contexts_its_threads_use(driver, monkeypatch, workers, per_process, expected):
    """Workers are threads on the first min(workers, GPUs) GPUs; with a process per GPU this one has the
    first GPU only (each child makes its own)."""
    if per_process:
        monkeypatch.setenv(PROCESS_PER_GPU_ENV, "1")
    make_contexts_early(workers)
    assert retained(driver) == expected


def test_no_context_is_started_without_a_gpu(driver, monkeypatch):
    driver.count = 0
    make_contexts_early(2)
    early.make_context_early(0)
    assert retained(driver) == []


def test_the_cpu_backend_starts_no_context(driver):
    assert get_backend("cpu").name == "cpu"
    assert retained(driver) == []
