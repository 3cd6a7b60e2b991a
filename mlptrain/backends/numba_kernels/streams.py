"""The stream every launcher queues on, and CUDA-graph capture of a run of launches.

A numba launch costs ~26 µs of host time, so a training step of a small model
(~16 launches) is bound by the host, not the GPU. Recorded once into a CUDA
graph, the same launches replay for ~1 µs each. Launchers queue on
`current()`: the legacy default stream, except while `capture` records on
a private non-blocking stream (the legacy stream cannot be captured). Replays
go back onto the legacy stream, so they stay ordered with every other launch
and copy without extra synchronisation.

A replay repeats the recorded kernels with the recorded arguments: the
buffers must stay where they are (the training session allocates everything
once), and whatever changes from one replay to the next must be read from
device memory (the window's position in the epoch, the step state).
"""

from __future__ import annotations

import importlib.util
import weakref

from numba import cuda

_stream = 0


def current():
    """The stream launchers queue on."""
    return _stream


def graphs_supported() -> bool:
    """CUDA graphs need a real GPU and the driver bindings (numba-cuda's `cuda.bindings`)."""
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from numba import config

    if config.ENABLE_CUDASIM:
        return False
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ImportError:  # no `cuda` package at all
        return False


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
        global _stream
        # imported on first use: numba takes seconds to import, and the CPU path never needs it
        from cuda.bindings import driver

        raw = _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        stream = cuda.external_stream(int(raw))
        _check(driver.cuStreamBeginCapture(raw, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture")
        _stream = stream
        try:
            record()
        except BaseException:
            driver.cuStreamEndCapture(raw)  # ends the capture; its partial graph is dropped
            driver.cuStreamDestroy(raw)
            raise
        finally:
            _stream = 0
        graph = _check(driver.cuStreamEndCapture(raw), "cuStreamEndCapture")
        self._exec = _check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        _check(driver.cuGraphDestroy(graph), "cuGraphDestroy")
        weakref.finalize(self, _destroy, self._exec, raw)

    def replay(self) -> None:
        # imported on first use: numba takes seconds to import, and the CPU path never needs it
        from cuda.bindings import driver

        _check(driver.cuGraphLaunch(self._exec, driver.CUstream(0)), "cuGraphLaunch")


def _destroy(graph_exec, stream):
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from cuda.bindings import driver

    driver.cuGraphExecDestroy(graph_exec)
    driver.cuStreamDestroy(stream)

