"""The stream a thread's kernel launches queue on, for a caller that switches between runs of one thread
(mlptrain.packing.side_by_side). It imports nothing: a process that never made a CUDA backend has no stream to
switch, and need not load the kernel modules (or NumPy) to say so."""

from __future__ import annotations

import sys

STREAMS_MODULE = "mlptrain.backends.numba_kernels.streams"  # loaded by every CUDA backend (CudaBackend)


def launch_stream():
    """This thread's launch stream (numba_kernels.streams.current); None where no CUDA backend was made."""
    streams = sys.modules.get(STREAMS_MODULE)
    return streams.current() if streams is not None else None


def use_launch_stream(stream) -> None:
    """Queue this thread's launches on `stream` from now on (a value launch_stream returned; None: nothing)."""
    if stream is not None:
        sys.modules[STREAMS_MODULE].use(stream)
