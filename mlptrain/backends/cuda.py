"""The CUDA backend: device arrays and the Numba kernel set (numba_kernels/), and whether a GPU is usable at
all. The driver library answers the questions about GPUs; numba is imported only where a kernel must be
compiled, on the simulator, or with MLPTRAIN_CUDA_LAUNCH=numba, so neither the CPU path nor a GPU run whose
kernels are all cached pays for it."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import weakref
from copy import copy as shallow_copy

import numpy as np

from mlptrain.backends.cuda_devices import DriverDevice, NumbaDevice
from mlptrain.backends.driver.early import driver_gpu_count
from mlptrain.errors import OutOfMemory
from mlptrain.util.interrupts import raise_interruption

RESIDENT_ARRAYS = 8  # a session's data is 4-5 arrays (images, labels, test images and labels)


class CudaBackend:
    """Satisfies `mlptrain.backends.protocol.Backend` on a GPU.

    Made in the thread that will use it: `device` (the index among the visible GPUs; default: the thread's
    current one, else the first) becomes the thread's GPU, and with `own_stream` every launch, copy and
    synchronisation of this thread goes to a stream of its own, so that several of a sweep's trials share a
    GPU at once (mlptrain.sweep.threads). The stream is a blocking one: anything that still reaches the legacy
    default stream waits for it, as before.

    Its arrays and launches go through the driver (mlptrain.backends.driver) wherever the kernel modules defer
    numba (kernel_cache.numba_names): numba is then imported only if a kernel must be compiled. On the
    simulator, or with MLPTRAIN_CUDA_LAUNCH=numba, they are numba's device arrays and launches."""

    name = "cuda"

    def __init__(self, device: int | None = None, own_stream: bool = False, resident: "ResidentCopies | None" = None):
        # here, not at the top: the CPU path never loads the kernel modules
        from mlptrain.backends import numba_kernels
        from mlptrain.backends.kernel_cache.numba_names import DEFERRED
        from mlptrain.backends.numba_kernels import streams

        self.kernels = numba_kernels
        self.fallbacks = []
        self._resident = resident if resident is not None else ResidentCopies()
        self._device = DriverDevice(device, own_stream) if DEFERRED else NumbaDevice(device, own_stream)
        self.stream = self._device.stream
        self._beside_pending = False  # whether a `beside` block's launches wait for join_beside
        self.launched_beside = False  # whether a `beside` block went to a second stream (summary.json's beside_launch)
        streams.use(self.stream)
        self.device_name = self._device.name

    def empty(self, shape, dtype=np.float32):
        with gpu_memory_errors(math.prod(np.atleast_1d(shape)) * np.dtype(dtype).itemsize):
            return self._device.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        with gpu_memory_errors(math.prod(np.atleast_1d(shape)) * np.dtype(dtype).itemsize):
            return self._device.zeros(shape, dtype)

    def zero(self, array) -> None:
        self._device.zero(array, self.stream)

    @property
    def copies_lane_views(self) -> bool:
        """On the driver's path (a copy of rows apart); numba's copies only contiguous arrays."""
        return self._device.copies_lane_views

    def to_device(self, array):
        array = np.ascontiguousarray(array)
        with gpu_memory_errors(array.nbytes):
            return self._device.to_device(array)

    def resident(self, array):
        """A device copy of `array` made once and kept while the same host array comes back (a sweep's trials
        on this backend's thread upload their dataset once: 55 MB for MNIST, ~8 ms a trial), by every backend
        given the same `resident` copies (the backends of one GPU in a process: packed trials, a sweep's
        threads); at most RESIDENT_ARRAYS are kept, the least recently asked for given up first."""
        return self._resident.get(array, self._upload)

    def resident_index(self, index):
        """A split's row index on the device, uploaded once per GPU (ResidentCopies.get_while_alive): a packed
        lane copied each of its three into its own rows, ~3.6 ms of a lane's ~18 ms start on the GPU machine,
        and 16 lanes of two seeds hold five distinct ones (benchmarks/NOTES.md, issue 30 step 25)."""
        return self._resident.get_while_alive(index, self._upload)

    def holds(self, array) -> bool:
        """Whether `resident(array)` (or `resident_index`) would reuse a copy already on the device."""
        return self._resident.holds(array)

    def _upload(self, array):
        """A device copy whole before this returns: other backends' streams use it without waiting on this one."""
        copy = self.to_device(array)
        self.synchronize()
        return copy

    def to_host(self, array):
        host = array.copy_to_host(stream=self.stream)
        if self.stream:  # a stream's copy may return before it is done
            self.stream.synchronize()
        return host

    def copy_from_host(self, dst, src):
        dst.copy_to_device(np.ascontiguousarray(src, dtype=dst.dtype), stream=self.stream)

    def copy_from_host_later(self, dst, src):
        """`src` staged in pinned host memory, from which the copy is queued (host_copies.send): a copy from
        pageable memory of 64 KB or more returned only once the stream had reached it (an epoch's order, ~0.5 ms
        a lane at each epoch start of a 16-lane sweep on an H200, the GPU idle meanwhile: benchmarks/NOTES.md,
        issue 30 step 33). Where the device stages nothing (numba's path; no pinned buffer of that size held yet,
        as at a run's first epoch, whose reservations are made meanwhile), copy_from_host."""
        if not self._device.copy_from_host_later(dst, np.ascontiguousarray(src, dtype=dst.dtype), self.stream):
            self.copy_from_host(dst, src)

    def synchronize(self):
        if self.stream:
            self.stream.synchronize()
        else:
            self._device.synchronize()

    def mark(self):
        """An event recorded after the launches this backend queued so far (see Backend.mark); None on the
        simulator and numba's path, whose launches a caller waits for by reading their results."""
        return self._device.mark(self.stream)

    @contextlib.contextmanager
    def urgent(self, after=None):
        """The block's launches and copies go to a stream of this backend that the GPU serves before every
        other (the highest priority), after what it queued so far (`after`, a mark, is for lanes: a run of its
        own waits for all it queued); what it queues after the block waits for them. For a packed run's
        evaluation (mlptrain.packing.side_by_side), which the host waits for while the other runs' steps fill
        the GPU. Without a stream of its own (the legacy default stream) or on numba's path, as it is."""
        urgent = self._device.urgent_stream() if self.stream else None
        if urgent is None:
            yield
            return
        # imported on first use: the CPU path never needs the kernel modules (loaded by __init__ here)
        from mlptrain.backends.numba_kernels import streams

        home = self.stream
        self._device.follow(urgent, home)
        self.stream = urgent
        streams.use(urgent)
        try:
            yield
        finally:
            self._device.follow(home, urgent)
            self.stream = home
            streams.use(home)

    def overtaking(self, after):
        """A copy of this backend on its urgent stream, which waits for `after` (this backend's mark) alone, not
        for what was queued since: one packed lane's evaluation (mlptrain.packing.lane_slabs). None without a
        stream of its own or on numba's path. `rejoin(copy)`: this backend's stream then waits for its work."""
        urgent = self._device.urgent_stream() if self.stream and after is not None else None
        if urgent is None:
            return None
        view = shallow_copy(self)
        view.stream = urgent
        self._device.wait_for(urgent, after)
        return view

    def rejoin(self, view) -> None:
        self._device.wait_for(self.stream, view.mark())

    @contextlib.contextmanager
    def beside(self):
        """The block's launches go to a second stream of this backend (the device's `beside_stream`), after what
        the thread's launch stream (a graph's capture stream while one records) queued so far; `join_beside`
        makes that stream wait for them. In a captured graph they are a branch of their own. On numba's path,
        the simulator, or with MLPTRAIN_BESIDE=0, in order on the one stream."""
        # imported on first use: the CPU path never needs the kernel modules (loaded by __init__ here)
        from mlptrain.backends.numba_kernels import streams

        side = self._device.beside_stream()
        if side is None:
            yield
            return
        home = streams.current()
        self._device.follow(side, home)
        self._beside_pending = self.launched_beside = True
        streams.use(side)
        try:
            yield
        finally:
            streams.use(home)

    def join_beside(self) -> None:
        if self._beside_pending:
            # imported on first use: the CPU path never needs the kernel modules (loaded by __init__ here)
            from mlptrain.backends.numba_kernels import streams

            self._device.follow(streams.current(), self._device.beside_stream())
            self._beside_pending = False

    def copy(self, dst, src):
        """dst = src on the device, queued after the launches so far."""
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"copy: {src.shape} {src.dtype} into {dst.shape} {dst.dtype}")
        self._device.copy(dst, src, self.stream)

    def to_host_after(self, array, mark):
        """A host copy of `array` as it is once `mark` (this backend's) is done, without waiting for what was
        queued after the mark; `mark` None: to_host."""
        return self.to_host(array) if mark is None else self._device.to_host_after(array, mark)

    def to_host_later(self, arrays):
        """Host copies of `arrays` as they are after the launches queued so far, queued now and taken later
        (mlptrain.backends.host_copies): `.take()` returns them, `.views()` lends them in their pinned memory
        until `.drop()`, which gives them up."""
        # imported on first use: the CPU path never needs it
        from mlptrain.backends.host_copies import Ready

        staged = self._device.to_host_later(arrays, self.stream)
        return staged if staged is not None else Ready([self.to_host(array) for array in arrays])

    def reserve_host_copies(self, *copies) -> None:
        """Memory for `to_host_later(arrays)`'s copies of each `arrays` of `copies`, made ready behind the host's
        back."""
        self._device.reserve_host_copies(copies)

    def free_bytes(self) -> int | None:
        """Bytes free on the GPU now; None on the simulator or a driver that will not say (the allocation
        itself will tell)."""
        try:
            return self._device.free_bytes()
        except Exception:
            return None

    def start_compilers(self):
        """On a machine with no compiled kernels yet, start the processes that will compile them, so that
        they start while the data loads (numba_kernels.kernel_cache)."""
        # imported on first use: the CPU path never needs the kernel cache
        from mlptrain.backends.kernel_cache import cache as kernel_cache

        kernel_cache.start_workers_if_cold()

    def capture(self, record):
        """The launches `record()` makes, captured (not run) as a CUDA graph whose `replay()` queues them all
        at once; None on the simulator."""
        # imported on first use: the CPU path never needs the kernel modules
        from mlptrain.backends.numba_kernels import streams

        return streams.Graph(record) if streams.graphs_supported() else None

    def graphs_unavailable(self) -> str | None:
        """Why `capture` records nothing (None: it records)."""
        # imported on first use: the CPU path never needs the kernel modules
        from mlptrain.backends.kernel_cache.numba_names import SIMULATOR
        from mlptrain.backends.numba_kernels import streams

        if streams.graphs_supported():
            return None
        if SIMULATOR:
            return "the CUDA simulator cannot capture graphs"
        return "numba-cuda's driver bindings (the cuda.bindings package) are not installed"


class ResidentCopies:
    """Device copies of host arrays, by the host array's identity, in the order last asked for: what
    CudaBackend.resident keeps, for one backend or for all the backends of one GPU in a process (threads may
    share them: a lock guards them, and an upload holds it, so that an array is uploaded once)."""

    def __init__(self):
        self._copies = {}  # id(host array) -> (host array, device copy)
        self._alive = {}  # id(host array) -> (a weak reference to it, device copy): get_while_alive's
        self._lock = threading.Lock()

    def get(self, array, upload):
        """The copy of `array`, made by `upload(array)` where none is kept."""
        with self._lock:
            entry = self._copies.pop(id(array), None)
            if entry is None or entry[0] is not array:
                entry = (array, upload(array))
            self._copies[id(array)] = entry  # last: the most recently asked for
            while len(self._copies) > RESIDENT_ARRAYS:
                del self._copies[next(iter(self._copies))]
            return entry[1]

    def get_while_alive(self, array, upload):
        """The copy of `array` (read-only: a split's row index), made by `upload(array)` where none is kept, and
        kept while `array` lives, apart from the latest few that `get` keeps (a sweep of 16 seeds would have
        pushed its dataset out of those)."""
        with self._lock:
            entry = self._alive.get(id(array))
            if entry is None or entry[0]() is not array:
                entry = self._alive[id(array)] = (weakref.ref(array), upload(array))
                # dropped with the host array, before its id can be another's (a dict's pop needs no lock)
                weakref.finalize(array, self._alive.pop, id(array), None)
            return entry[1]

    def holds(self, array) -> bool:
        with self._lock:
            entry = self._copies.get(id(array))
            alive = self._alive.get(id(array))
            return (entry is not None and entry[0] is array) or (alive is not None and alive[0]() is array)


_LEFT_TO_THE_DRIVER = []  # the deferrals leave_to_the_driver entered: held (never left) until the process ends


def leave_to_the_driver(device: int) -> None:
    """From now on this process frees nothing of `device`'s context itself: the driver frees it all when the
    process exits. numba frees a context's memory, streams and kernels through a queue that whichever thread
    adds to next empties, and at exit it unloads every kernel from the main thread, where another GPU's
    context is current: on two H200s that crashed the process as it exited (a sweep's threads had trained
    on both). Call it once every thread that used `device` has ended, for each GPU they used."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or "numba.cuda" not in sys.modules:
        return  # numba never made or retained a context here: nothing of its to keep from freeing
    # imported here: numba is already imported (above)
    from numba import cuda

    with cuda.gpus[device]:
        deferral = cuda.current_context().defer_cleanup()
        deferral.__enter__()  # and never left: the generator is kept, or collecting it would leave it
        _LEFT_TO_THE_DRIVER.append(deferral)


OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY


@contextlib.contextmanager
def gpu_memory_errors(nbytes: int):
    """The driver's out-of-memory error on an allocation of `nbytes` as one line saying what to change (the
    memory estimate, mlptrain.training.memory_plan, refuses what it knows cannot fit before anything is allocated; this
    catches what it could not know: other processes on the GPU, fragmentation)."""
    try:
        yield
    except Exception as err:
        if getattr(err, "code", None) != OUT_OF_MEMORY and "OUT_OF_MEMORY" not in str(err):
            raise
        raise OutOfMemory(f"the GPU ran out of memory allocating {nbytes / 2**20:,.1f} MiB; use a smaller "
                        "train.batch_size (with train.grad_accum_steps for the same effective batch), a smaller "
                        "model or train.eval_batch_size, or free the GPU (nvidia-smi shows who holds it)") from None


def driver_unusable_reason() -> str | None:
    """Why the CUDA driver has no GPU to offer (driver_gpu_count); None when it reports a GPU, or when only
    numba can tell."""
    found = driver_gpu_count()
    return found if isinstance(found, str) else None


def cuda_unusable_reason() -> str | None:
    """None when a GPU is usable, else why not, on one line (the driver's own words where it has some).
    The driver is asked first: importing numba and probing through it takes seconds on a machine
    without a GPU, which `backend: auto` would pay on every run there."""
    found = driver_gpu_count()
    if isinstance(found, str):
        return found
    if isinstance(found, int) and _driver_path():
        return None  # the driver offers a GPU, and the driver path (not numba) will use it
    try:
        # imported on first use: numba takes seconds to import, and the CPU path never needs it
        from numba import cuda

        if cuda.is_available():
            return None
        len(cuda.gpus)  # raises the driver's reason, which is_available() swallows
        return "numba found no CUDA GPU"
    except Exception as err:  # a missing or broken driver or toolkit means: not usable, and this is why
        raise_interruption(err)  # Ctrl-C while numba imports is no missing GPU (auto would fall back to the CPU)
        return " ".join(str(err).split()).rstrip(" :") or type(err).__name__


def _driver_path() -> bool:
    # imported on first use: it decides whether numba is deferred, which only a GPU run needs to know
    from mlptrain.backends.kernel_cache.numba_names import DEFERRED

    return DEFERRED


def cuda_usable() -> bool:
    return cuda_unusable_reason() is None


def gpu_count() -> int:
    """GPUs this process can use (CUDA_VISIBLE_DEVICES applied): the driver's count, or numba's where only
    numba can tell (the simulator); 0 when no GPU is usable."""
    found = driver_gpu_count()
    if isinstance(found, int):
        return found
    if isinstance(found, str):
        return 0
    # imported on first use: numba takes seconds to import, and only the simulator or a non-Linux system gets here
    from numba import cuda

    return len(cuda.gpus) if cuda_usable() else 0
