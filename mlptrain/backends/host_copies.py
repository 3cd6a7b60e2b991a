"""Host copies of device arrays queued now and taken later (Backend.to_host_later): a run's checkpoint at an
epoch's end, written or dropped epochs later, without the host waiting for the copy where it is queued.

Packed runs in lanes end their epochs in lockstep, each in turn while the GPU idles (mlptrain.packing.lane_group),
and a sweep's trial copied its checkpoint to the host at every epoch that improved on its best, to keep it in
memory until its files are written at its end: 5.7 ms of each lane's 13 ms epoch end on an H100
(benchmarks/NOTES.md, issue 30 step 10).

On the driver's path the copies go, on the backend's stream, into page-locked ("pinned") host memory, which the
copy engine fills while the host goes on; the launches queued after them on that stream wait for them, so they
hold the arrays as they were when queued. `take` waits for them (long done, an epoch later) and returns copies in
ordinary memory, giving the pinned memory back to a pool that the process's later copies reuse. Elsewhere (the
CPU, the simulator, numba's path), over PINNED_MOST at once, or past PINNED_LIMIT pinned in all, the copies are
made where they are asked for (`Ready`), as before: the same arrays, the host waiting for them there.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

PINNED_MOST = 256 * 2**20  # one set of copies: adam_mnist's checkpoint is 8 MB
PINNED_LIMIT = 2**30  # pinned in all: memory the system cannot page out
ALIGN = 256  # each copy's start in a buffer
# A buffer up to CARVED_MOST is cut from a CHUNK pinned at once: a period's read (its rows and the step state,
# ~32 KB for adam_mnist) takes one, and pinning cost ~1.5 ms an allocation however small on the GPU machine, ~96 of
# them on the thread that feeds a 16-lane group in its first epoch (benchmarks/NOTES.md, issue 30 step 16)
CARVED_MOST = 64 * 2**10
CHUNK = 2**20


class Ready:
    """Host copies made already."""

    mark = None  # nothing to wait for

    def __init__(self, arrays: list[np.ndarray]):
        self._arrays = arrays

    def take(self) -> list[np.ndarray]:
        return self._arrays

    def views(self) -> list[np.ndarray]:
        return self._arrays

    def drop(self) -> None:
        self._arrays = None


class Staged:
    """Copies queued into a pinned buffer of `pool`, done once `done` (an event recorded after them) is."""

    def __init__(self, pool: "PinnedPool", buffer: np.ndarray, done, views: list[np.ndarray]):
        self._pool, self._buffer, self._done, self._views = pool, buffer, done, views
        self._taken = None
        self._landed = False  # the copies waited for: the buffer can go back from a thread with no GPU context

    def take(self) -> list[np.ndarray]:
        """The arrays as they were when queued, in ordinary memory (the same list again at a second call)."""
        if self._taken is None:
            self._taken = [view.copy() for view in self.views()]
            self._release()
        return self._taken

    @property
    def mark(self):
        """The mark recorded after the copies (the launches before them are done once it is)."""
        return self._done

    def views(self) -> list[np.ndarray]:
        """The arrays as they were when queued, in the pinned buffer itself: no copy, valid until `drop` gives the
        buffer back. A checkpoint is written from them (8 MB a lane of adam_mnist copied out took ~4 ms on the thread
        that feeds a packed group, 16 times at the sweep's end) and dropped once written."""
        if self._views is None:
            raise RuntimeError("these host copies were dropped")
        self._land()
        return self._views

    def drop(self) -> None:
        """Not taken, or taken as `views` and done with: the buffer goes back to the pool once the copies into it
        are done."""
        self._release()

    def _land(self) -> None:
        if not self._landed:
            self._done.wait()
            self._landed = True

    def _release(self) -> None:
        if self._buffer is not None:
            self._land()  # a copy still in flight must not land in the buffer's next use
            self._pool.give_back(self._buffer)
            self._buffer, self._views = None, None

    def __del__(self):  # neither taken nor dropped (a run that failed): its buffer is still the pool's
        try:
            self._release()
        except Exception:  # a driver gone bad after an earlier error: the buffer stays out of the pool
            pass


class PinnedPool:
    """Pinned buffers of this process, reused: a buffer given back serves the next copies that fit in it."""

    def __init__(self, allocate):
        self._allocate = allocate  # nbytes -> (address, nbytes)
        self._free: list[np.ndarray] = []
        self._pinned = 0
        self._lock = threading.Lock()  # a sweep's worker threads copy at once
        self._reserving: list[threading.Thread] = []
        self._chunk, self._cut = None, 0  # the chunk small buffers are cut from, and how much of it is cut
        self._cutting = threading.Lock()  # one chunk pinned at a time
        self._sending: list[tuple] = []  # (mark, buffer): a copy to the device from the buffer, queued (send)

    def take(self, nbytes: int, reserved: bool = True, pin: bool = True) -> np.ndarray | None:
        """A buffer of at least `nbytes` (uint8), or None past the limits; `reserved` False: none of the
        reservations on their way (they hold an epoch end's copies) is waited for; `pin` False: only a buffer
        the pool holds already (None where none fits)."""
        while True:
            with self._lock:
                fits = [buffer for buffer in self._free if nbytes <= buffer.nbytes <= 2 * nbytes]
                if fits:
                    buffer = min(fits, key=lambda b: b.nbytes)
                    del self._free[next(i for i, b in enumerate(self._free) if b is buffer)]  # not ==: elementwise
                    return buffer
                # a small buffer is no reservation's (those hold an epoch end's copies): cut at once
                waiting = self._reserving[:1] if nbytes > CARVED_MOST and reserved else []
            if not waiting:
                return self._new(nbytes, self._allocate) if pin else None
            waiting[0].join()  # a buffer on its way may be this one's
            with self._lock:
                if waiting[0] in self._reserving:
                    self._reserving.remove(waiting[0])

    def _new(self, nbytes: int, allocate) -> np.ndarray | None:
        return self._cut_out(nbytes, allocate) if nbytes <= CARVED_MOST else self._pin(nbytes, allocate)

    def _cut_out(self, nbytes: int, allocate) -> np.ndarray | None:
        """A buffer of `nbytes` cut from the current chunk, or from a new one; pinned alone where the limits leave
        no chunk."""
        with self._cutting:
            if self._chunk is None or self._cut + nbytes > self._chunk.nbytes:
                chunk = self._pin(CHUNK, allocate)
                if chunk is None:
                    return self._pin(nbytes, allocate)
                self._chunk, self._cut = chunk, 0
            buffer = self._chunk[self._cut:self._cut + nbytes]
            self._cut += -(-nbytes // ALIGN) * ALIGN
            return buffer

    def _pin(self, nbytes: int, allocate) -> np.ndarray | None:
        with self._lock:
            if nbytes > PINNED_MOST or self._pinned + nbytes > PINNED_LIMIT:
                return None
            self._pinned += nbytes  # counted before the allocation, which runs unlocked
        try:
            address, size = allocate(nbytes)
        except BaseException:
            with self._lock:
                self._pinned -= nbytes
            raise
        return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))

    def reserve(self, sizes: list[int], allocate) -> None:
        """A buffer for copies of each of `sizes` bytes allocated in turn on a thread of its own (`allocate` there:
        the driver's, with the context current), while the device trains: pinning memory costs ~1 ms a MB on the
        GPU machine's VMs, which a lockstep group of lanes, each taking its first buffers at the same epoch's end,
        would otherwise wait for in turn; one thread for them all, as starting one costs the caller ~2 ms when
        others run. A failure is left to the copies that need the buffer (they allocate it or copy at once)."""
        def run():
            for nbytes in sizes:
                try:
                    buffer = self._new(nbytes, allocate)
                except Exception:
                    return
                if buffer is not None:
                    self.give_back(buffer)

        thread = threading.Thread(target=run, name="mlptrain-pinned", daemon=True)
        thread.start()  # before `take` can see it: a thread is joined once started
        with self._lock:
            self._reserving = [t for t in self._reserving if t.is_alive()] + [thread]

    def give_back(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.append(buffer)

    def give_back_after(self, buffer: np.ndarray, mark) -> None:
        """`buffer` back once `mark` (an event after the copy that reads it) is done, as seen by a later `reclaim`."""
        with self._lock:
            self._sending.append((mark, buffer))

    def reclaim(self) -> None:
        """The buffers of `give_back_after` whose copies are done, back in the pool."""
        with self._lock:
            sending, self._sending = self._sending, []
        done = [mark.done() for mark, _ in sending]  # driver calls: outside the lock
        with self._lock:
            self._free += [buffer for (_, buffer), finished in zip(sending, done) if finished]
            self._sending += [entry for entry, finished in zip(sending, done) if not finished]


_POOL: list[PinnedPool] = []  # the process's pool, made on first use
_POOL_LOCK = threading.Lock()


def pool(allocate) -> PinnedPool:
    """The process's pool of pinned buffers (`allocate`: the driver's, for its first buffer)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(PinnedPool(allocate))
        return _POOL[0]


def layout(arrays) -> tuple[list[int], int]:
    """Each array's byte offset in one buffer holding them all, and the buffer's size."""
    offsets, end = [], 0
    for array in arrays:
        offsets.append(end)
        end += -(-array.nbytes // ALIGN) * ALIGN
    return offsets, end


def send(pool: PinnedPool, dst, src: np.ndarray, stream, record) -> bool:
    """`src` (C-contiguous, `dst`'s dtype and size) copied into a buffer of `pool` and queued from there into `dst`
    (a driver DeviceArray) on `stream`: from pinned memory the copy is the copy engine's alone, and the host goes on
    at once. The buffer goes back to the pool once `record(stream)`'s mark is done (seen at a later send). False
    where the pool holds no buffer that fits: none is pinned here (pinning took ~2 ms a lane of a 16-lane sweep's
    first epoch start, on the host's path: benchmarks/NOTES.md, issue 30 step 33), nor is a reservation on its way
    waited for; the caller copies from pageable memory, as it would without the pool."""
    pool.reclaim()
    buffer = pool.take(src.nbytes, reserved=False, pin=False)
    if buffer is None:
        return False
    view = buffer[:src.nbytes].view(src.dtype).reshape(src.shape)
    np.copyto(view, src)
    dst.copy_to_device(view, stream)
    pool.give_back_after(buffer, record(stream))
    return True


def stage(pool: PinnedPool, arrays, stream, record) -> Staged | None:
    """`arrays` (driver DeviceArrays, C-contiguous) queued on `stream` into one buffer of `pool`, `record(stream)`
    marking their end; None where the pool gives no buffer."""
    offsets, nbytes = layout(arrays)
    buffer = pool.take(nbytes)
    if buffer is None:
        return None
    views = []
    for array, offset in zip(arrays, offsets):
        view = buffer[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
        array.copy_into(view, stream)
        views.append(view)
    return Staged(pool, buffer, record(stream), views)
