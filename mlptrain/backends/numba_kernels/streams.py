"""The stream every launcher queues on, and CUDA-graph capture of a run of launches.

A numba launch costs ~26 µs of host time, so a training step of a small model
(~16 launches) is bound by the host, not the GPU. Recorded once into a CUDA
graph, the same launches replay for ~1 µs each. Launchers queue on
`current()`: the thread's stream (`use`; the legacy default stream unless a
backend gave the thread one of its own), except while `capture` records on
a private non-blocking stream (the legacy stream cannot be captured). Replays
go back onto the stream the capture was made from, so they stay ordered with
every other launch and copy of that thread without extra synchronisation.

The stream is per thread because a sweep trains several trials at once in one
process (mlptrain.sweep.threads), each thread on its own GPU or its own stream
of a shared one: one thread's capture must not swallow another's launches.

A replay repeats the recorded kernels with the recorded arguments: the
buffers must stay where they are (the training session allocates everything
once), and whatever changes from one replay to the next must be read from
device memory (the window's position in the epoch, the step state).
"""

from __future__ import annotations

import threading
import weakref

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, SIMULATOR, bindings_installed, cuda

_local = threading.local()  # .stream: this thread's stream (0, the legacy default stream, when unset)


def current():
    """The stream launchers queue on: this thread's."""
    return getattr(_local, "stream", 0)


def use(stream) -> None:
    """Launches from this thread queue on `stream` (a numba stream or, on the driver path, a driver stream;
    0 for the legacy default stream)."""
    _local.stream = stream


def _handle(stream):
    """The driver's handle of a stream (0: the legacy default stream)."""
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from cuda.bindings import driver

    return driver.CUstream(0 if isinstance(stream, int) else int(stream))  # numba's Stream and ours: int() is the handle


def graphs_supported() -> bool:
    """CUDA graphs need a real GPU and the driver bindings (numba-cuda's `cuda.bindings`)."""
    return not SIMULATOR and bindings_installed()


def _check(result, what):
    """cuda.bindings calls return (CUresult, *values)."""
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err.name if hasattr(err, 'name') else err}")
    return values[0] if len(values) == 1 else values


class Graph:
    """The launches `record()` makes, captured once and replayed by `replay()`."""

    def __init__(self, record):
        # imported on first use: numba takes seconds to import, and the CPU path never needs it
        from cuda.bindings import driver

        home = current()  # replays go where the launches would have gone
        self._replay_on = _handle(home)
        context = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        raw = _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        stream = _wrapped(raw)
        # thread-local: other threads (a sweep's other trials) may allocate and synchronise meanwhile
        _check(driver.cuStreamBeginCapture(raw, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture")
        use(stream)
        try:
            record()
        except BaseException:
            driver.cuStreamEndCapture(raw)  # ends the capture; its partial graph is dropped
            driver.cuStreamDestroy(raw)
            raise
        finally:
            use(home)
        graph = _check(driver.cuStreamEndCapture(raw), "cuStreamEndCapture")
        self._exec = _check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        _check(driver.cuGraphDestroy(graph), "cuGraphDestroy")
        weakref.finalize(self, _destroy, self._exec, raw, context)
        self._launch, self._success = driver.cuGraphLaunch, driver.CUresult.CUDA_SUCCESS  # a replay per step: looked up once

    def replay(self) -> None:
        err, = self._launch(self._exec, self._replay_on)
        if err != self._success:
            raise RuntimeError(f"cuGraphLaunch failed: {getattr(err, 'name', err)}")


def _wrapped(raw):
    """A stream made through the driver, as this process's launches take it."""
    if DEFERRED:
        # imported on first use: the driver's bindings load only on a GPU
        from mlptrain.backends.driver.api import Stream

        return Stream(raw)
    return cuda.external_stream(int(raw))


def _destroy(graph_exec, stream, context):
    """Free a graph and its capture stream in the context they were made in: the garbage collector may run
    this in another thread, current on another GPU or on none."""
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from cuda.bindings import driver

    driver.cuCtxPushCurrent(context)
    try:
        driver.cuGraphExecDestroy(graph_exec)
        driver.cuStreamDestroy(stream)
    finally:
        driver.cuCtxPopCurrent()

