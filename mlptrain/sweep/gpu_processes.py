"""A sweep's process per GPU, told without CUDA: which GPUs this machine offers, each process's share of the
workers, and whether this process may fork them. The standard library only (and whether the driver's early
start has run): the command decides this at its first line (mlptrain.sweep.prefork), before it imports
anything that starts a thread or the CUDA driver."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from mlptrain.backends.driver.early import driver_started

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # a folder per GPU the NVIDIA driver gives this machine (container)
PR_SET_PDEATHSIG = 1  # prctl(2)
PROCESS_PER_GPU_ENV = "MLPTRAIN_SWEEP_PROCESS_PER_GPU"  # "1": a process per GPU; "0": threads (see process_per_gpu)
BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # read by NumPy's BLAS at start


def process_per_gpu(workers: int, gpus: int, forking: bool = True) -> bool:
    """Whether the workers run as a process per GPU: more than one GPU in use, and either asked for
    ($MLPTRAIN_SWEEP_PROCESS_PER_GPU=1: forked, else started from nothing) or, unless refused ("0"), where
    the processes are forked (`forking`). A started child reaches its first trial later than a thread
    would, so without a fork the workers are threads unless asked otherwise."""
    setting = os.environ.get(PROCESS_PER_GPU_ENV)
    return min(workers, gpus) > 1 and (setting == "1" or (setting != "0" and forking))


def gpu_shares(workers: int, gpus: int) -> list[int]:
    """How many of `workers` run on each of the first min(workers, gpus) GPUs: worker i on GPU i mod that."""
    used = min(workers, gpus)
    return [len(range(j, workers, used)) for j in range(used)]


def visible_slots(environ=None, gpus_folder: Path | None = None) -> list[str] | None:
    """The GPUs CUDA will offer this process, as the CUDA_VISIBLE_DEVICES value that pins each one, told
    without starting CUDA: CUDA_VISIBLE_DEVICES's indices (up to the first that names no GPU the driver
    has, where CUDA stops reading it), else one index per GPU in the NVIDIA driver's folder. None where that
    folder cannot be read (no driver, not Linux), under the CUDA simulator, or where CUDA_VISIBLE_DEVICES
    names GPUs by UUID or MIG instance: only the driver can tell those, so the command does not fork."""
    environ = os.environ if environ is None else environ
    gpus_folder = NVIDIA_GPUS if gpus_folder is None else gpus_folder
    if environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return None
    try:
        bound = len(list(gpus_folder.iterdir()))
    except OSError:
        return None
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(bound)]
    slots = []
    for entry in (part.strip() for part in visible.split(",")):
        if not entry.isdigit():
            return None if entry.upper().startswith(("GPU-", "MIG-")) else slots
        if int(entry) >= bound or entry in slots:
            break
        slots.append(entry)
    return slots


def threads_now() -> int:
    """The threads this process has, the operating system's count (a library's own threads included); 0
    where it cannot be read."""
    try:
        with open("/proc/self/status") as status:
            return next((int(line.split()[1]) for line in status if line.startswith("Threads:")), 0)
    except OSError:
        return 0


def can_fork() -> bool:
    """Whether a child forked now would start clean: Linux (the only system where the sweep counts GPUs
    without the driver), no thread but this one, and the CUDA driver not started here (a child forked after
    cuInit cannot use the GPU)."""
    return (hasattr(os, "fork") and sys.platform.startswith("linux") and threads_now() == 1
            and not driver_started())


def detach(slot: str | None) -> None:
    """In a child just forked as a worker: a session of its own, as a started worker has (Ctrl-C reaches it
    once, from the command), SIGTERM when the command dies, and its GPU pinned (`slot`, a CUDA_VISIBLE_DEVICES
    value; None: unpinned)."""
    os.setsid()
    die_with_parent()
    if slot is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = slot


def die_with_parent() -> None:
    """In each worker (Linux): SIGTERM when the parent dies, even by SIGKILL, so that none is orphaned."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a parent killed with SIGKILL leaves its workers running
        pass
