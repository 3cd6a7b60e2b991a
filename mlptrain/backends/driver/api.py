"""The driver calls the numba-free CUDA path makes, each checked: a failing call raises `DriverError` naming
the call and the driver's error."""

from __future__ import annotations

import functools
import threading
import weakref

from cuda.bindings import driver as cu

from mlptrain.backends.driver import host_pages

OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"


class DriverError(RuntimeError):
    """A driver call that failed; `code` is the driver's error name."""

    def __init__(self, what: str, code: str):
        super().__init__(f"{what} failed: {code}")
        self.code = code


def check(result, what: str):
    """cuda.bindings calls return (CUresult, *values): the values, or DriverError."""
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DriverError(what, getattr(err, "name", str(err)))
    return values[0] if len(values) == 1 else values or None


@functools.cache
def started() -> None:
    check(cu.cuInit(0), "cuInit")


_contexts: dict[int, object] = {}
_contexts_lock = threading.Lock()


def primary_context(device: int):
    """`device`'s primary context (the one numba uses too), retained once per process and left to the driver to
    free when the process ends."""
    started()
    with _contexts_lock:
        if device not in _contexts:
            handle = check(cu.cuDeviceGet(device), "cuDeviceGet")
            _contexts[device] = check(cu.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
        return _contexts[device]


_local = threading.local()  # .device: the GPU use_device made current in this thread


def use_device(device: int) -> None:
    """Make `device`'s primary context this thread's current one."""
    check(cu.cuCtxSetCurrent(primary_context(device)), "cuCtxSetCurrent")
    _local.device = device


def current_device() -> int | None:
    """The GPU whose context is current in this thread (what use_device set, else the driver's answer); None
    when none is."""
    device = getattr(_local, "device", None)
    if device is not None:
        return device
    started()
    if not int(check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")):
        return None
    return int(check(cu.cuCtxGetDevice(), "cuCtxGetDevice"))


def ensure_context() -> None:
    """A thread with no current context gets the first GPU's (a thread that never made a backend: tests,
    a garbage collection)."""
    if current_device() is None:
        use_device(0)


def current_context():
    return check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")


def set_current(context) -> None:
    """`context` (current_context's) current in this thread: a thread of the process's own that calls the driver."""
    check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")


@functools.cache
def capability(device: int) -> tuple[int, int]:
    started()
    handle = check(cu.cuDeviceGet(device), "cuDeviceGet")
    attribute = cu.CUdevice_attribute
    return (check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle), "cuDeviceGetAttribute"),
            check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle), "cuDeviceGetAttribute"))


@functools.cache
def device_name(device: int) -> str:
    started()
    raw = check(cu.cuDeviceGetName(256, check(cu.cuDeviceGet(device), "cuDeviceGet")), "cuDeviceGetName")
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def memory_info() -> tuple[int, int]:
    """(free, total) bytes of the current GPU."""
    free, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
    return int(free), int(total)


class Stream:
    """A blocking stream of the current context (as numba's cuda.stream()), or one made elsewhere (`handle`)."""

    __slots__ = ("handle",)

    def __init__(self, handle=None, priority: int | None = None):
        if handle is None:
            handle = check(cu.cuStreamCreate(0), "cuStreamCreate") if priority is None else \
                check(cu.cuStreamCreateWithPriority(0, priority), "cuStreamCreateWithPriority")
        self.handle = handle

    def __int__(self):
        return int(self.handle)

    def synchronize(self) -> None:
        check(cu.cuStreamSynchronize(self.handle), "cuStreamSynchronize")


# A context's events whose objects are gone, for its next ones: a packed sweep's feeding thread makes an event
# for every read's copies and every epoch end's marks, and on some of the GPU machine's hosts cuEventCreate and
# cuEventDestroy (its context pushed and popped) were a tenth of that thread's samples in the GPU's idle gaps
# (benchmarks/NOTES.md, issue 30 step 17). The process's contexts are primary contexts, retained for its life.
_SPARE_EVENTS: dict[int, list] = {}


class Event:
    """A point in a stream's work (`record`, which every maker calls first), which the host can ask about without
    waiting (`done`); when the last reference goes, kept for the context's next event."""

    __slots__ = ("handle", "_finished", "__weakref__")

    def __init__(self):
        self._finished = False  # seen done: a packed group's lanes ask one event in turn
        context = current_context()
        try:
            self.handle = _SPARE_EVENTS[int(context)].pop()
        except (KeyError, IndexError):
            self.handle = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        # none kept at exit: the driver frees a process's events with its context, as its memory
        weakref.finalize(self, _spare_event, self.handle, int(context)).atexit = False

    def record(self, stream) -> "Event":
        check(cu.cuEventRecord(self.handle, handle(stream)), "cuEventRecord")
        self._finished = False
        return self

    def done(self) -> bool:
        """Whether the stream has run everything queued before the record."""
        if self._finished:
            return True
        err, = cu.cuEventQuery(self.handle)
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuEventQuery")
        self._finished = True
        return True

    def wait(self) -> None:
        if not self._finished:
            check(cu.cuEventSynchronize(self.handle), "cuEventSynchronize")
            self._finished = True


def _spare_event(event, context: int) -> None:
    """From any thread (a garbage collection): a list's append needs no context."""
    _SPARE_EVENTS.setdefault(context, []).append(event)


def highest_priority() -> int:
    """The current context's highest stream priority (the numerically lowest)."""
    _least, greatest = check(cu.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
    return int(greatest)


def side_stream() -> "Stream":
    """A stream that waits for no other (non-blocking: not even the legacy default stream) unless told to."""
    return Stream(check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"))


def wait_for(stream, event: Event) -> None:
    """Work queued on `stream` from now on starts once `event` is done."""
    check(cu.cuStreamWaitEvent(handle(stream), event.handle, 0), "cuStreamWaitEvent")


def handle(stream):
    """The driver's handle of a stream argument (0: the legacy default stream)."""
    return stream.handle if isinstance(stream, Stream) else cu.CUstream(int(stream))


def synchronize() -> None:
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def allocate(nbytes: int) -> int:
    return int(check(cu.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))


def free(pointer: int, context) -> None:
    """Free `pointer` in `context`: a garbage collection may run this in any thread, current on another GPU.
    A free the driver refuses (its context gone bad after an earlier error) leaves the block to the driver,
    which frees it with the process, rather than print a traceback from the collector."""
    _in_context(context, cu.cuMemFree, pointer)


def _in_context(context, call, *args) -> None:
    """`call(*args)` with `context` current for it in this thread (whichever was current before comes back);
    nothing where the context cannot be made current (gone bad after an earlier error)."""
    if cu.cuCtxPushCurrent(context)[0] != cu.CUresult.CUDA_SUCCESS:
        return
    try:
        call(*args)
    finally:
        cu.cuCtxPopCurrent()


def to_device(pointer: int, host_address: int, nbytes: int, stream) -> None:
    if nbytes:
        check(cu.cuMemcpyHtoDAsync(pointer, host_address, nbytes, handle(stream)), "cuMemcpyHtoDAsync")


def copy(dst: int, src: int, nbytes: int, stream) -> None:
    if nbytes:
        check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, handle(stream)), "cuMemcpyDtoDAsync")


def to_host(host_address: int, pointer: int, nbytes: int, stream) -> None:
    if nbytes:
        check(cu.cuMemcpyDtoHAsync(host_address, pointer, nbytes, handle(stream)), "cuMemcpyDtoHAsync")


def rows_to_host(host_address: int, pointer: int, row_bytes: int, rows: int, pitch: int, stream) -> None:
    """`rows` rows of `row_bytes` bytes each, `pitch` bytes apart on the device, packed into host memory."""
    if row_bytes and rows:
        copy = cu.CUDA_MEMCPY2D()
        copy.srcMemoryType, copy.srcDevice, copy.srcPitch = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, pointer, pitch
        copy.dstMemoryType, copy.dstHost, copy.dstPitch = cu.CUmemorytype.CU_MEMORYTYPE_HOST, host_address, row_bytes
        copy.WidthInBytes, copy.Height = row_bytes, rows
        check(cu.cuMemcpy2DAsync(copy, handle(stream)), "cuMemcpy2DAsync")


def pinned(nbytes: int) -> tuple[int, int]:
    """(address, nbytes) of page-locked host memory, which a copy from the device fills while the host goes on
    (into ordinary memory, cuMemcpyDtoHAsync returns once it is done); portable: any context may copy into it.
    Kept until the process ends (mlptrain.backends.host_copies pools it). Memory of the process's own
    (host_pages, which says why) registered with the driver; cuMemHostAlloc's where the GPU cannot register it."""
    if not host_register_supported(current_device()):
        return int(check(cu.cuMemHostAlloc(max(nbytes, 1), cu.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc")), nbytes
    pages = host_pages.mapped(nbytes)
    check(cu.cuMemHostRegister(pages.ctypes.data, pages.nbytes, cu.CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister")
    return int(pages.ctypes.data), nbytes


@functools.cache
def host_register_supported(device: int) -> bool:
    handle = check(cu.cuDeviceGet(device), "cuDeviceGet")
    attribute = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED
    return bool(check(cu.cuDeviceGetAttribute(attribute, handle), "cuDeviceGetAttribute"))


def zero(pointer: int, nbytes: int, stream) -> None:
    if nbytes:
        check(cu.cuMemsetD8Async(pointer, 0, nbytes, handle(stream)), "cuMemsetD8Async")


def load_function(image: bytes, name: str):
    """The kernel `name` of a cubin, loaded into the current context."""
    module = check(cu.cuModuleLoadData(image), "cuModuleLoadData")
    return check(cu.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")


def launch(function, grid: tuple, block: tuple, stream, parameters: int, early: bool = False,
           cluster: tuple | None = None) -> None:
    """Queue `function` with the kernel parameters at address `parameters` (an array of pointers). `early`: with
    programmatic stream serialization, so the GPU may launch it before the kernel ahead of it in the stream has
    ended (a kernel that waits for that one first: numba_kernels.grid_order; see dependent_launches). `cluster`:
    the grid's blocks in thread-block clusters of these dimensions (numba_kernels.cluster; see
    cluster_launches)."""
    if early or cluster is not None:
        check(cu.cuLaunchKernelEx(_config(grid, block, int(handle(stream)), early, cluster), function, parameters, 0),
              "cuLaunchKernelEx")
    else:
        check(cu.cuLaunchKernel(function, *grid, *block, 0, handle(stream), parameters, 0), "cuLaunchKernel")


@functools.lru_cache(maxsize=512)
def _config(grid: tuple, block: tuple, stream: int, early: bool, cluster: tuple | None):
    """The launch configuration of an `early` or clustered launch (kept: a step launches the same few shapes every
    time)."""
    attributes = []
    if early:
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        attributes.append(attribute)
    if cluster is not None:
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster
        attributes.append(attribute)
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes, config.hStream = 0, cu.CUstream(stream)
    config.attrs, config.numAttrs = attributes, len(attributes)
    return config


@functools.cache
def cluster_launches(device: int) -> bool:
    """Whether kernels on `device` may be launched in thread-block clusters: compute capability 9.0 or later."""
    return capability(device) >= (9, 0)


@functools.cache
def dependent_launches(device: int) -> bool:
    """Whether kernels on `device` may be launched `early`: compute capability 9.0 or later (griddepcontrol) and
    a driver of CUDA 12.3 or later (such launches captured into CUDA graphs)."""
    return capability(device) >= (9, 0) and check(cu.cuDriverGetVersion(), "cuDriverGetVersion") >= 12030
