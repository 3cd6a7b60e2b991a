"""Backend.to_host_later: copies queued now, taken later, hold the arrays as they were when queued; the pinned
buffers behind them (mlptrain.backends.host_copies) are reused, bounded and never given out twice."""

import ctypes
import threading

import numpy as np
import pytest

from mlptrain.backends import host_copies
from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend
from mlptrain.backends.host_copies import PinnedPool, Staged, layout, stage


class _Allocations:
    """Ordinary memory standing in for the driver's pinned allocations, kept alive and counted."""

    def __init__(self):
        self.blocks = []

    def __call__(self, nbytes: int):
        block = ctypes.create_string_buffer(nbytes)
        self.blocks.append(block)
        return ctypes.addressof(block), nbytes


class _Event:
    def __init__(self):
        self.waits = 0

    def wait(self):
        self.waits += 1


class _DeviceArray:
    """A stand-in for a driver DeviceArray whose copy lands when queued (the host would see it once done)."""

    def __init__(self, values):
        self.values, self.shape, self.dtype, self.nbytes = values, values.shape, values.dtype, values.nbytes

    def copy_into(self, host, stream):
        host[...] = self.values


def test_staged_copies_are_taken_once_and_their_buffer_goes_back():
    pool, event = PinnedPool(_Allocations()), _Event()
    arrays = [_DeviceArray(np.arange(7, dtype=np.float32)), _DeviceArray(np.full((2, 3), 5.0)),
              _DeviceArray(np.zeros(0, np.int64))]
    staged = stage(pool, arrays, 0, lambda stream: event)
    taken = staged.take()
    for got, array in zip(taken, arrays):
        np.testing.assert_array_equal(got, array.values)
        assert got.dtype == array.dtype and got.flags.owndata  # its own memory: not a view of the pool's buffer
    assert staged.take() is taken and event.waits >= 1
    again = stage(pool, arrays[:1], 0, lambda stream: _Event())  # the buffer given back serves the next copies
    assert len(pool._allocate.blocks) == 1
    again.drop()
    assert len(pool._free) == 1


def test_staged_copies_lent_as_views_are_the_pinned_buffer_until_dropped():
    """`views`: the arrays in the pool's buffer itself (a checkpoint written from them), no copy; `drop` gives the
    buffer back, from any thread: the copies were waited for when lent, so no driver call is made there."""
    pool, event = PinnedPool(_Allocations()), _Event()
    arrays = [_DeviceArray(np.arange(7, dtype=np.float32)), _DeviceArray(np.full((2, 3), 5.0))]
    staged = stage(pool, arrays, 0, lambda stream: event)
    views = staged.views()
    for got, array in zip(views, arrays):
        np.testing.assert_array_equal(got, array.values)
        assert got.dtype == array.dtype and not got.flags.owndata  # the buffer's memory
    assert staged.views() is views and event.waits == 1 and not pool._free
    staged.drop()
    assert event.waits == 1 and len(pool._free) == 1  # not waited for again
    with pytest.raises(RuntimeError, match="dropped"):
        staged.views()


def test_a_dropped_or_forgotten_copy_waits_for_its_copy_before_its_buffer_is_reused():
    pool, event = PinnedPool(_Allocations()), _Event()
    staged = stage(pool, [_DeviceArray(np.ones(64, np.float32))], 0, lambda stream: event)
    staged.drop()
    staged.drop()  # twice: given back once
    assert event.waits == 1 and len(pool._free) == 1
    forgotten = stage(pool, [_DeviceArray(np.ones(64, np.float32))], 0, lambda stream: _Event())
    assert not pool._free
    del forgotten  # neither taken nor dropped (a run that failed): its buffer is the pool's again
    assert len(pool._free) == 1


def test_the_pool_is_bounded_and_fits_buffers_to_their_copies(monkeypatch):
    monkeypatch.setattr(host_copies, "PINNED_MOST", 4096)
    monkeypatch.setattr(host_copies, "PINNED_LIMIT", 6144)
    allocations = _Allocations()
    pool = PinnedPool(allocations)
    assert pool.take(4097) is None  # one set of copies past PINNED_MOST
    first, second = pool.take(4096), pool.take(2048)
    assert first.nbytes == 4096 and second.nbytes == 2048
    assert pool.take(1) is None  # past PINNED_LIMIT in all
    pool.give_back(first)
    assert pool.take(1024) is None  # a buffer over twice the copies' size is not spent on them
    assert pool.take(3000) is first


def test_buffers_of_several_sizes_given_back_are_each_taken_by_their_fit():
    pool = PinnedPool(_Allocations())
    large, small, other = pool.take(8192), pool.take(1024), pool.take(1024)
    for buffer in (large, small, other):
        pool.give_back(buffer)
    assert pool.take(1000) is small and pool.take(1000) is other  # found by identity, not compared as arrays
    assert pool.take(5000) is large


def test_each_copy_starts_aligned_in_its_buffer():
    offsets, end = layout([np.zeros(3, np.float32), np.zeros(0), np.zeros(300, np.uint8), np.zeros(1)])
    assert offsets == [0, 256, 256, 768] and end == 1024


def test_a_failing_event_leaves_the_buffer_out_of_the_pool():
    class Failing:
        def wait(self):
            raise RuntimeError("driver gone")

    pool = PinnedPool(_Allocations())
    staged = Staged(pool, pool.take(16), Failing(), [])
    staged.__del__()  # what the collector calls: no traceback, the buffer not reused
    assert not pool._free


def _later_holds_what_was_queued(backend):
    source = backend.to_device(np.arange(1000, dtype=np.float32))
    kept = backend.to_device(np.arange(3, dtype=np.int64))
    copies = backend.to_host_later([source, kept])
    backend.copy_from_host(source, np.zeros(1000, np.float32))  # queued after the copies: not what they hold
    values, counts = copies.take()
    np.testing.assert_array_equal(values, np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(counts, np.arange(3))
    assert copies.take()[0] is values
    backend.to_host_later([source]).drop()


def test_the_cpu_backend_copies_at_once():
    _later_holds_what_was_queued(CpuBackend())


@pytest.mark.gpu
def test_a_gpu_backend_copies_behind_the_host():
    """On the driver's path the copies are staged in pinned memory (on the simulator and numba's, made at once)."""
    backend = CudaBackend(own_stream=True)
    _later_holds_what_was_queued(backend)
    rows = backend.zeros((4, 300), np.float32)  # a lane's row of a slab
    backend.copy_from_host(rows, np.arange(1200, dtype=np.float32).reshape(4, 300))
    copies = backend.to_host_later([rows[2]])
    backend.copy_from_host(rows, np.zeros((4, 300), np.float32))
    np.testing.assert_array_equal(copies.take()[0], np.arange(600, 900, dtype=np.float32))
    if backend.copies_lane_views:  # the driver's path: a lane view's rows, apart on the device, in one copy
        from mlptrain.backends.lanes import lane_view

        backend.copy_from_host(rows, np.arange(1200, dtype=np.float32).reshape(4, 300))
        copies = backend.to_host_later([lane_view(rows, 100, (37,))])
        backend.copy_from_host(rows, np.zeros((4, 300), np.float32))
        np.testing.assert_array_equal(copies.take()[0], np.arange(1200, dtype=np.float32).reshape(4, 300)[:, 100:137])
    else:  # numba's path (the simulator, or MLPTRAIN_CUDA_LAUNCH=numba): no lane view is given it to copy
        import os

        assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("MLPTRAIN_CUDA_LAUNCH") == "numba"


def test_a_reserved_buffer_serves_the_first_copies_and_a_failed_reservation_leaves_them_to_allocate(monkeypatch):
    monkeypatch.setattr(host_copies, "CARVED_MOST", 0)  # buffers pinned each alone, as an epoch end's are
    own, reserving = _Allocations(), _Allocations()
    pool = PinnedPool(own)
    pool.reserve([1000, 3000], reserving)
    buffer = pool.take(1000)  # waits for the reservation on its way
    assert buffer.nbytes == 1000 and len(reserving.blocks) == 2 and not own.blocks
    assert pool.take(3000).nbytes == 3000 and not own.blocks

    def failing(nbytes):
        raise RuntimeError("no pinned memory")

    pool.reserve([1000], failing)
    assert pool.take(1000).nbytes == 1000 and len(own.blocks) == 1
    assert pool._pinned == 5000  # the failed reservation's bytes are not counted


def test_small_buffers_are_cut_from_one_pinned_chunk_without_waiting_for_a_reservation(monkeypatch):
    """A period's read takes a small buffer: cut from a chunk pinned once (pinning costs the same however small),
    each cut aligned and apart from the others, reused once given back; a new chunk when one is used up, a buffer
    pinned alone where the limits leave no chunk; never waiting for a reservation of an epoch end's buffers."""
    allocations = _Allocations()
    pool = PinnedPool(allocations)
    first, second = pool.take(1000), pool.take(3000)
    assert (first.nbytes, second.nbytes) == (1000, 3000) and len(allocations.blocks) == 1
    assert not np.shares_memory(first, second) and second.ctypes.data - first.ctypes.data == 1024
    assert pool._pinned == host_copies.CHUNK
    pool.give_back(first)
    assert pool.take(900) is first
    pool.take(host_copies.CHUNK - 4096 - 100)  # past CARVED_MOST: pinned alone
    for _ in range(host_copies.CHUNK // host_copies.CARVED_MOST):  # the chunk used up: a second one
        pool.take(host_copies.CARVED_MOST)
    assert len(allocations.blocks) == 3  # the first chunk, the buffer pinned alone, the second chunk
    monkeypatch.setattr(host_copies, "PINNED_LIMIT", 4096)  # no room for a chunk
    tight = _Allocations()
    alone = PinnedPool(tight).take(1000)
    assert alone.nbytes == 1000 and [len(block) for block in tight.blocks] == [1000]
    import threading

    released = threading.Event()

    def slow(nbytes):  # a reservation still pinning an epoch end's buffers
        released.wait(5)
        return allocations(nbytes)

    fresh = PinnedPool(_Allocations())
    fresh.reserve([2 * host_copies.CARVED_MOST], slow)
    assert fresh.take(2000).nbytes == 2000 and not released.is_set()  # cut at once, the reservation under way
    released.set()


class _Mark:
    def __init__(self):
        self.finished = False

    def done(self):
        return self.finished


class _Target:
    """A stand-in for a driver DeviceArray: what a copy to it read, when queued (the copy engine's source)."""

    def __init__(self):
        self.sources = []

    def copy_to_device(self, host, stream):
        self.sources.append(host)


def test_a_copy_to_the_device_is_sent_from_a_pinned_buffer_held_until_its_mark_is_done(monkeypatch):
    """Backend.copy_from_host_later on the driver's path (host_copies.send): the source copied into a pool buffer,
    the device copy queued from it, the caller's array free at once; the buffer back in the pool only once the mark
    after the copy is done. Only a buffer the pool holds: none is pinned on the caller's path, nor is a reservation
    on its way waited for (a run's first epoch starts beside its own): the caller then copies as before."""
    monkeypatch.setattr(host_copies, "CARVED_MOST", 0)  # pinned alone, as an epoch's order is
    allocations, marks, target = _Allocations(), [], _Target()
    pool = PinnedPool(allocations)

    def record(stream):
        marks.append(_Mark())
        return marks[-1]

    release = threading.Event()

    def reserving(nbytes):  # a reservation still on its way while the copy is sent (10 s at most: no hang)
        release.wait(10)
        return allocations(nbytes)

    pool.reserve([4000], reserving)
    order = np.arange(1000, dtype=np.int32)
    assert not host_copies.send(pool, target, order, 0, record)  # none held yet: the caller copies
    assert pool._reserving[0].is_alive() and not allocations.blocks and not target.sources  # not waited for
    release.set()
    pool._reserving[0].join()
    pool.give_back(pool._new(4000, allocations))  # a second buffer held, as a later epoch's copies leave them
    assert host_copies.send(pool, target, order, 0, record)
    sent = target.sources[0]
    order[:] = -1  # the caller's array, changed at once: the copy reads the buffer
    np.testing.assert_array_equal(sent, np.arange(1000, dtype=np.int32))
    assert sent.dtype == np.int32 and not np.shares_memory(sent, order)
    assert host_copies.send(pool, target, order, 0, record)  # the first copy not done: the other buffer
    assert not np.shares_memory(target.sources[1], sent)
    assert not host_copies.send(pool, target, order, 0, record)  # neither done: none left, none pinned
    marks[0].finished = True
    assert host_copies.send(pool, target, order, 0, record)  # the first buffer back, and taken again
    assert np.shares_memory(target.sources[2], sent) and len(allocations.blocks) == 2


def test_the_cpu_backend_copies_from_the_host_later_at_once():
    backend, source = CpuBackend(), np.arange(5, dtype=np.int32)
    target = backend.zeros((5,), np.int32)
    backend.copy_from_host_later(target, source)
    source[:] = 0
    np.testing.assert_array_equal(target, np.arange(5))


@pytest.mark.gpu
def test_a_gpu_backends_copy_from_the_host_later_holds_the_source_as_it_was():
    """On every path the device array gets the source as it was when the copy was asked for, in order with the
    stream's work before and after it."""
    backend = CudaBackend(own_stream=True)
    target = backend.zeros((300_000,), np.int32)  # over 64 KB: from pageable memory the host waited for the stream
    source = np.arange(300_000, dtype=np.int32)
    for round in range(3):
        backend.copy_from_host_later(target, source + round)
        source[:] = -7  # at once: the copy holds the values asked for
        np.testing.assert_array_equal(backend.to_host(target), np.arange(300_000) + round)
        source = np.arange(300_000, dtype=np.int32)
