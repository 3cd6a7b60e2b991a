"""Host-to-device copies through pinned buffers (mlptrain.backends.uploads): a copy lands the host's bytes whichever
way it goes; a buffer serves again only once its copy is done; a miss goes pageable and pins one for the next; the
pinned total is bounded."""

import ctypes
import threading
import time

import numpy as np
import pytest

from mlptrain.backends import uploads
from mlptrain.backends.uploads import UPLOAD_LEAST, UPLOAD_MOST, Uploads


class FakeDriver:
    """Device memory as a dict of bytearrays by pointer; copies land when their event is done (`land`)."""

    def __init__(self):
        self.memory, self.queued, self.blocks, self.pageable = {}, [], [], 0
        self.lock = threading.Lock()

    def to_device(self, pointer, address, nbytes, stream):
        data = ctypes.string_at(address, nbytes)  # what the source holds now
        pinned = any(ctypes.addressof(block) <= address < ctypes.addressof(block) + len(block) for block in self.blocks)
        if not pinned:
            self.pageable += 1
        with self.lock:
            self.queued.append((pointer, address, nbytes, pinned, data))

    def land(self):
        """The queued copies reach the device: from a pinned buffer, what it holds when the DMA runs."""
        with self.lock:
            queued, self.queued = self.queued, []
        for pointer, address, nbytes, pinned, data in queued:
            self.memory[pointer] = ctypes.string_at(address, nbytes) if pinned else data
        for event in Event.made:
            event.ready = True

    def current_context(self):
        return "context"

    def set_current(self, context):
        assert context == "context"

    def pinned(self, nbytes):
        block = ctypes.create_string_buffer(nbytes)
        self.blocks.append(block)
        return ctypes.addressof(block), nbytes

    def Event(self):  # noqa: N802 - the driver api's name
        return Event()


class Event:
    made = []

    def __init__(self):
        self.ready = False
        Event.made.append(self)

    def record(self, stream):
        return self

    def done(self):
        return self.ready


def settle(ups: Uploads):
    for _ in range(200):  # the pinning thread's buffers
        if not ups.pinning:
            return
        time.sleep(0.01)
    raise AssertionError("the pinning thread did not finish")


def test_copies_land_the_hosts_bytes_and_a_buffer_serves_again_only_once_its_copy_is_done():
    Event.made.clear()
    driver = FakeDriver()
    ups = Uploads(driver)
    rng = np.random.default_rng(0)
    first = rng.integers(0, 2**31, 50_000).astype(np.int32)  # 200 KB: an MNIST epoch's order
    ups.copy(1000, first, 0)
    assert driver.pageable == 1  # a miss: pageable now, a buffer pinned for the next
    settle(ups)
    driver.land()
    second, third = (rng.integers(0, 2**31, 50_000).astype(np.int32) for _ in range(2))
    ups.copy(2000, second, 0)  # through the pinned buffer
    ups.copy(3000, third, 0)  # its buffer is busy (the copy above not done): pageable, and another pinned
    assert driver.pageable == 2
    second[:] = 0  # the caller's array may change at once: the pinned buffer holds its bytes
    settle(ups)
    driver.land()
    assert driver.memory[1000] == first.tobytes() and driver.memory[3000] == third.tobytes()
    assert driver.memory[2000] != second.tobytes()  # it landed what `second` was when copied
    for pointer in (4000, 5000):  # both buffers free now: no pageable copy
        ups.copy(pointer, third, 0)
    assert driver.pageable == 2
    driver.land()
    assert driver.memory[4000] == driver.memory[5000] == third.tobytes()


def test_small_and_large_copies_go_as_before_and_pinning_is_bounded(monkeypatch):
    Event.made.clear()
    driver = FakeDriver()
    ups = Uploads(driver)
    ups.copy(1, np.zeros(UPLOAD_LEAST // 8 - 1, np.float64), 0)  # queued inline by the driver: never staged
    ups.copy(2, np.zeros(UPLOAD_MOST // 4 + 1, np.float32), 0)  # a run's parameters: once
    settle(ups)
    assert driver.pageable == 2 and not driver.blocks
    monkeypatch.setattr(uploads, "PINNED_MOST", 3 * UPLOAD_LEAST)
    for i in range(5):  # misses of one size in a burst: pinned up to the bound
        ups.copy(10 + i, np.zeros(UPLOAD_LEAST, np.uint8), 0)
    settle(ups)
    assert len(driver.blocks) == 3 and sum(len(block) for block in driver.blocks) == 3 * UPLOAD_LEAST


@pytest.mark.real_gpu
def test_a_backends_copies_from_the_host_land_whichever_way_they_go():
    from mlptrain.backends.cuda import CudaBackend

    backend = CudaBackend(own_stream=True)
    rng = np.random.default_rng(1)
    arrays = [backend.empty((50_000,), np.int32) for _ in range(6)]
    expected = []
    for epoch in range(4):  # a buffer pinned after the first, reused once its copies are done
        for array in arrays:
            host = rng.integers(0, 2**31, 50_000).astype(np.int32)
            backend.copy_from_host(array, host)
            expected.append(host.copy())
            host[:] = -1  # changed at once: the copy holds what it was
        backend.synchronize()
        for array, values in zip(arrays, expected[-len(arrays):]):
            assert np.array_equal(backend.to_host(array), values)
