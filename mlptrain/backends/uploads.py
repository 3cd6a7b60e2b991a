"""Host-to-device copies through pinned buffers, on the driver's path (mlptrain.backends.cuda_devices).

A copy from ordinary (pageable) host memory goes through the driver's own staging memory, and a copy of 64 KB or
more waits there until the copies queued before it on its stream have left, behind every launch queued ahead of
them. A packed group's lanes load their epoch's order (200 KB for MNIST) at each epoch's start, 16 in turn on
the group's stream while its last steps run: each load took 0.7-1.0 ms of the feeding thread, 0.1-0.15 s in a
10-epoch sweep, while the GPU ran out of queued steps (benchmarks/NOTES.md, issue 30 step 23). From a pinned
buffer the copy is queued at once.

A copy of UPLOAD_LEAST to UPLOAD_MOST bytes takes a free pinned buffer of its size (an event recorded after the
copy says when it is free again); where none is free, it is copied from pageable memory as before and a buffer of
that size is pinned on a thread of its own for the next one (pinning costs ~1 ms a MB and ~1.5 ms a call). Smaller
copies the driver queues with the launches; larger ones are a run's parameters, loaded once.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

UPLOAD_LEAST = 64 * 2**10  # smaller copies never wait for the stream
UPLOAD_MOST = 2**20  # larger ones are loaded once a run (its parameters, its data once a process)
PINNED_MOST = 32 * 2**20  # upload buffers in all (a 16-lane group's orders: 3.2 MB)


class Uploads:
    """One backend's pinned upload buffers: free, or busy until the event recorded after their copy is done."""

    def __init__(self, api):
        self._api = api
        self._free: list[np.ndarray] = []
        self._busy: list[tuple[object, np.ndarray]] = []
        self._pinned = 0
        self._lock = threading.Lock()  # the pinning thread gives its buffers back here
        self._wanted: list[int] = []  # sizes to pin, in order
        self._pinning: threading.Thread | None = None

    @property
    def pinning(self) -> bool:
        """Whether buffers are being pinned now."""
        with self._lock:
            return self._pinning is not None

    def copy(self, pointer: int, host: np.ndarray, stream) -> None:
        """`pointer`'s `host.nbytes` bytes = `host` (C-contiguous), queued on `stream`."""
        nbytes = host.nbytes
        buffer = self._take(nbytes) if UPLOAD_LEAST <= nbytes <= UPLOAD_MOST else None
        if buffer is None:
            self._api.to_device(pointer, host.ctypes.data, nbytes, stream)
            if UPLOAD_LEAST <= nbytes <= UPLOAD_MOST:
                self._pin_later(nbytes)
            return
        ctypes.memmove(buffer.ctypes.data, host.ctypes.data, nbytes)
        self._api.to_device(pointer, buffer.ctypes.data, nbytes, stream)
        done = self._api.Event().record(stream)
        with self._lock:
            self._busy.append((done, buffer))

    def _take(self, nbytes: int) -> np.ndarray | None:
        """A free buffer of nbytes to 2 x nbytes (the smallest), or None."""
        with self._lock:
            still = []
            for done, buffer in self._busy:
                if done.done():
                    self._free.append(buffer)
                else:
                    still.append((done, buffer))
            self._busy = still
            fits = [i for i, buffer in enumerate(self._free) if nbytes <= buffer.nbytes <= 2 * nbytes]
            if not fits:
                return None
            return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))

    def _pin_later(self, nbytes: int) -> None:
        size = -(-nbytes // UPLOAD_LEAST) * UPLOAD_LEAST
        with self._lock:
            if self._pinned + size > PINNED_MOST:
                return
            self._pinned += size  # counted now: a burst of misses asks for no more than the limit
            self._wanted.append(size)
            if self._pinning is not None:  # running: it takes this size too
                return
            context = self._api.current_context()
            self._pinning = threading.Thread(target=self._pin, args=(context,), name="mlptrain-uploads", daemon=True)
            self._pinning.start()

    def _pin(self, context) -> None:
        """Pin the wanted buffers in turn, with the backend's context current (the driver pins for a context); a
        failure leaves its copies pageable."""
        try:
            self._api.set_current(context)
        except Exception:
            with self._lock:
                self._pinned -= sum(self._wanted)
                self._wanted, self._pinning = [], None
            return
        while True:
            with self._lock:
                if not self._wanted:
                    self._pinning = None  # under the lock: a size wanted after this starts another thread
                    return
                size = self._wanted.pop(0)
            try:
                address, pinned = self._api.pinned(size)
            except Exception:
                with self._lock:
                    self._pinned -= size
                continue
            buffer = np.ctypeslib.as_array((ctypes.c_uint8 * pinned).from_address(address))
            with self._lock:
                self._free.append(buffer)
