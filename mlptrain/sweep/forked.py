"""A sweep's process per GPU, forked from the command before it starts anything.

Threads of one process take turns on its interpreter: two MNIST trials at once on two GPUs took 0.35 s
each where one alone takes 0.31 s, and the more GPUs, the longer the queue (benchmarks/NOTES.md, issue 29).
A child process per GPU has an interpreter of its own, but a child started from nothing pays Python, the
CLI and its imports before its first trial. A forked child starts from where the command stands: both then
import, start CUDA and load the data at once, on different cores, and reach their first trials together.
The `mlptrain` command forks them at its first line (mlptrain.sweep.prefork); a sweep called otherwise (from
Python, a test) forks them here, right after it has read the sweep file (`fork_child`).

A fork must come before the command starts CUDA (a child forked after cuInit cannot use the GPU) and
before it has any thread other than the main one (NumPy's BLAS starts its threads at import): `can_fork`
says whether it may, and where it may not the command's workers are threads (or, asked for, children
started from nothing: mlptrain.sweep.workers). So the GPUs are counted without the driver
(mlptrain.sweep.gpu_processes). Each child pins its GPU with CUDA_VISIBLE_DEVICES, as a child started from
nothing does, writes its output to worker-N.log, says its exit code through a pipe once its work is done,
and leaves with `os._exit`: its files are closed and flushed by then, and the interpreter's own teardown
(0.15 s) would only delay the sweep's end. The command waits for that code, not for the process's end
(the driver's teardown of its GPU context, 0.06-0.1 s more): it may return while a child's process still
ends, which the system then reaps.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from rich.markup import escape

from mlptrain.errors import UserError
from mlptrain.sweep.gpu_processes import detach
from mlptrain.util.console import console, reopen_console
from mlptrain.util.regular_file import open_regular

POLL_S = 0.01  # how often `Forked.wait` looks
EXIT_HANDLERS_S = 30.0  # the longest a child's exit handlers may take once it has said its code (run_child)


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


def fork_child(run, log_path: Path, slot: str | None) -> Forked:
    """Fork a child that pins CUDA to GPU `slot` (a CUDA_VISIBLE_DEVICES value; None: unpinned), writes its
    output to `log_path` (appended to), runs `run()` and exits with the code it returns. The child has a
    session of its own, as a started one has (Ctrl-C reaches it once, from the command), and SIGTERM when
    the command dies. Raises UserError when the log cannot be opened."""
    log = open_log(log_path)
    for stream in (sys.stdout, sys.stderr):  # or the child would write the command's pending text again
        stream.flush()
    done, say_done = os.pipe()
    os.set_blocking(done, False)
    pid = os.fork()
    if pid:
        log.close()
        os.close(say_done)
        return Forked(pid, done)

    def start():
        os.close(done)
        detach(slot)
        return log

    run_child(start, run, say_done)


def open_log(log_path: Path):
    """A worker's log, open to append to (never through a link put in its place: mlptrain.run_dirs.links);
    UserError when it cannot be."""
    try:
        return open_regular(log_path, "a", follow=False)
    except OSError as err:
        raise UserError(f"{log_path}: cannot append to it ({err.strerror or err}); remove it") from None


def run_child(start, run, say_done: int) -> NoReturn:
    """The rest of a forked child's life: start() (which returns its open log, or None where it pointed the
    child's output elsewhere itself), its output to that log, run(), and its exit code said through the pipe
    `say_done` and ended with (`os._exit`: the command goes on once it has the code). Anything start() raises
    ends the child with 1 (2: a refusal).

    After the code, the exit handlers its work registered, as the interpreter's exit runs them: the drawing
    processes' shutdown (os._exit skips them, and left those processes holding the command's output pipe). They
    decide nothing the command waits for, and the shutdown took ~35-50 ms of a packed sweep's end: the command
    goes on meanwhile (benchmarks/NOTES.md, issue 30 step 30). A handler that hangs ends with the process after
    EXIT_HANDLERS_S: no command waits for it any more, and the child must not outlive it holding its GPU."""
    code = 1
    try:
        log = start()
        if log is not None:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            log.close()
        reopen_console()  # a log, not the command's terminal (no colours, no live display), or the terminal
        code = exit_code(run)
    except UserError:  # the log could not be opened: nowhere to say more, the code says it
        code = 2
    finally:
        _flush()
        # the command may end once it has the code: its SIGTERM (die_with_parent) must not stop this exit
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        try:
            os.write(say_done, bytes([code & 0xFF]))  # as the process's exit status would carry it
        except OSError:  # the command is gone; the exit itself tells whoever waits
            pass
        watchdog = threading.Timer(EXIT_HANDLERS_S, os._exit, (code,))
        watchdog.daemon = True
        watchdog.start()
        atexit._run_exitfuncs()  # (each handler's error is printed by it, and the rest still run)
        _flush()
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # the code is decided; a stream that cannot flush has nothing to add to it
            pass


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


