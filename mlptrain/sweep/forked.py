"""A sweep's process per GPU, forked from the command before it starts anything.

Threads of one process take turns on its interpreter: two MNIST trials at once on two GPUs took 0.35 s
each where one alone takes 0.31 s, and the more GPUs, the longer the queue (benchmarks/NOTES.md, issue 29).
A child process per GPU has an interpreter of its own, but a child started from nothing pays Python, the
CLI and its imports before its first trial. A child forked from the command right after it has read the
sweep file starts from where the command stands: both then import, start CUDA and load the data at once,
on different cores, and reach their first trials together.

A fork must come before the command starts CUDA (a child forked after cuInit cannot use the GPU) and
before it has any thread other than the main one (NumPy's BLAS starts its threads at import): `can_fork`
says whether it may, and where it may not the command's workers are threads (or, asked for, children
started from nothing: mlptrain.sweep.workers). So the GPUs are counted without the driver
(`visible_slots`). Each child pins its GPU with CUDA_VISIBLE_DEVICES, as a child started from nothing
does, writes its output to worker-N.log, says its exit code through a pipe once its work is done, and
leaves with `os._exit`: its files are closed and flushed by then, and the interpreter's own teardown
(0.15 s) would only delay the sweep's end.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from rich.markup import escape

from mlptrain.errors import UserError
from mlptrain.util.console import console, reopen_console
from mlptrain.util.regular_file import open_regular

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # a folder per GPU the NVIDIA driver gives this machine (container)
PR_SET_PDEATHSIG = 1  # prctl(2)
POLL_S = 0.01  # how often `Forked.wait` looks
PROCESS_PER_GPU_ENV = "MLPTRAIN_SWEEP_PROCESS_PER_GPU"  # "1": a process per GPU; "0": threads (see process_per_gpu)


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


def visible_slots(environ=None, gpus_folder: Path = NVIDIA_GPUS) -> list[str] | None:
    """The GPUs CUDA will offer this process, as the CUDA_VISIBLE_DEVICES value that pins each one, told
    without starting CUDA: CUDA_VISIBLE_DEVICES's indices (up to the first that names no GPU the driver
    has, where CUDA stops reading it), else one index per GPU in the NVIDIA driver's folder. None where that
    folder cannot be read (no driver, not Linux), under the CUDA simulator, or where CUDA_VISIBLE_DEVICES
    names GPUs by UUID or MIG instance: only the driver can tell those, so the command does not fork."""
    environ = os.environ if environ is None else environ
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


class Forked:
    """A forked child as subprocess.Popen presents one (`poll`, `wait`, `send_signal`, `kill`, `returncode`),
    so that the code that watches and stops a sweep's children treats either kind alike. A forked child
    also says its exit code through a pipe once its work is done, before its process ends (the driver's
    teardown of its GPU context takes a tenth of a second more): `poll` returns that code at once, and
    `wait` waits for the process itself."""

    def __init__(self, pid: int, done: int | None = None):
        self.pid, self.returncode, self._done, self._ended = pid, None, done, False

    def poll(self) -> int | None:
        if not self._ended:
            ended, status = os.waitpid(self.pid, os.WNOHANG)
            if ended:
                self._ended, self.returncode = True, os.waitstatus_to_exitcode(status)
                self._close()
        if self.returncode is None and self._done is not None:
            try:
                said = os.read(self._done, 1)
            except BlockingIOError:  # nothing said yet
                said = None
            if said:
                self.returncode = said[0]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None or not self._ended:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(POLL_S)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # it ended meanwhile; wait() collects its code
                pass

    def kill(self) -> None:
        if not self._ended:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _close(self) -> None:
        if self._done is not None:
            os.close(self._done)
            self._done = None


def can_fork() -> bool:
    """Whether a child forked now would start clean: Linux (the only system where the sweep counts GPUs
    without the driver) and no thread but this one."""
    return hasattr(os, "fork") and sys.platform.startswith("linux") and threads_now() == 1


def fork_child(run, log_path: Path, slot: str | None) -> Forked:
    """Fork a child that pins CUDA to GPU `slot` (a CUDA_VISIBLE_DEVICES value; None: unpinned), writes its
    output to `log_path` (appended to), runs `run()` and exits with the code it returns. The child has a
    session of its own, as a started one has (Ctrl-C reaches it once, from the command), and SIGTERM when
    the command dies. Raises UserError when the log cannot be opened."""
    try:  # appended to, so never through a link put in its place (mlptrain.run_dirs.links)
        log = open_regular(log_path, "a", follow=False)
    except OSError as err:
        raise UserError(f"{log_path}: cannot append to it ({err.strerror or err}); remove it") from None
    for stream in (sys.stdout, sys.stderr):  # or the child would write the command's pending text again
        stream.flush()
    done, say_done = os.pipe()
    os.set_blocking(done, False)
    pid = os.fork()
    if pid:
        log.close()
        os.close(say_done)
        return Forked(pid, done)
    code = 1
    try:
        os.close(done)
        os.setsid()
        die_with_parent()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        log.close()
        if slot is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = slot
        reopen_console()  # a log, not the command's terminal: no colours, no live display
        code = exit_code(run)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # the code is decided; a stream that cannot flush has nothing to add to it
                pass
        try:
            os.write(say_done, bytes([code & 0xFF]))  # as the process's exit status would carry it
        except OSError:  # the command is gone; the exit itself tells whoever waits
            pass
        os._exit(code)


def exit_code(run) -> int:
    """run() in a forked child, its outcome as the command's would be: its return value (None: 0); a
    refusal as one line and 2 (or its own code); Ctrl-C or SIGTERM as 128 + the signal; anything else with
    its traceback and 1."""
    try:
        code = run()
        return 0 if code is None else int(code)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    except UserError as err:
        console.print(f"[bold red]error:[/] {escape(' '.join(str(err).split()))}", highlight=False, soft_wrap=True)
        return getattr(err, "exit_code", 2)
    except KeyboardInterrupt as err:
        return 128 + getattr(err, "signum", signal.SIGINT)
    except BaseException as err:
        if hasattr(err, "exit_code"):  # Click's and Typer's Exit (a command's own way to end with a code)
            return int(err.exit_code)
        traceback.print_exc()
        return 1
    finally:
        logging.shutdown()  # Optuna's log handlers: flushed, as the interpreter's exit would


def die_with_parent() -> None:
    """In each worker (Linux): SIGTERM when the parent dies, even by SIGKILL, so that none is orphaned."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a parent killed with SIGKILL leaves its workers running
        pass
