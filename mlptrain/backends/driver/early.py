"""The CUDA driver started, and GPU contexts made, early: through the driver library itself (ctypes), in
threads, before anything heavy is imported. A command starts the driver (cuInit: 0.2-0.4 s of driver work,
during which ctypes lets the interpreter go) as its first step, so that the driver works while NumPy, Optuna
and the command's modules are imported. This module imports neither NumPy nor anything else that starts a
thread: a sweep forks its processes per GPU just before it starts the driver (mlptrain.sweep.forked)."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading


def driver_gpu_count() -> int | str | None:
    """The GPUs the CUDA driver offers this process (CUDA_VISIBLE_DEVICES applied), found in milliseconds by
    asking the driver library itself (ctypes: no numba import, no CUDA context); a string saying why the
    driver offers none; None when only numba can tell (the CUDA simulator, a system other than Linux)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not sys.platform.startswith("linux"):
        return None
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver: libcuda.so.1 not found"
    count = ctypes.c_int(0)
    status = driver.cuInit(0)
    if status != 0:
        return f"the CUDA driver failed to start (cuInit error {status})"
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "the CUDA driver sees no GPU"
    return count.value


CONTEXTS_STARTED: set[int] = set()  # the GPUs whose primary context make_context_early has started making
_EARLY_LOCK = threading.Lock()


@functools.cache  # once per process: the driver starts once
def start_driver() -> None:
    """Start the CUDA driver (cuInit: 0.2 s on an H100 host) in a thread: ctypes lets the interpreter go
    while it works, so the command's imports and config run meanwhile, and the later driver_gpu_count
    answers at once. Harmless where there is no driver (the thread finds none and ends)."""
    threading.Thread(target=driver_gpu_count, name="cuda-driver-start", daemon=True).start()


def driver_started() -> bool:
    """Whether start_driver has run in this process: a child forked from it from then on could not use CUDA."""
    return start_driver.cache_info().currsize > 0


def make_context_early(device: int | None) -> None:
    """Start making `device`'s primary CUDA context (None: the first visible GPU) in a thread, through the
    driver library, and return at once. Making a context takes 0.1-0.2 s of driver work, during which
    ctypes lets the interpreter go: numba's import (0.6 s) runs meanwhile, and numba then retains the same
    primary context and finds it made; on two GPUs their contexts are made at once. The reference taken
    here is never released: the driver frees the context when the process ends (see leave_to_the_driver).
    A driver error is left for numba to meet when it makes the context, and to report then."""
    device = 0 if device is None else device
    with _EARLY_LOCK:
        if device in CONTEXTS_STARTED:
            return
        CONTEXTS_STARTED.add(device)
    threading.Thread(target=_retain_primary_context, args=(device,), name=f"cuda-context-{device}",
                     daemon=True).start()


def _retain_primary_context(device: int) -> None:
    if not isinstance(driver_gpu_count(), int):  # no driver to ask, or no GPU: nothing to make
        return
    driver = ctypes.CDLL("libcuda.so.1")
    handle, context = ctypes.c_int(0), ctypes.c_void_p()
    if driver.cuDeviceGet(ctypes.byref(handle), device) == 0:
        driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle)
