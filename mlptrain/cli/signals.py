"""Ctrl-C and SIGTERM: one line and the right exit code in every command, from the first import on; during
training, finish the optimizer step, checkpoint, exit.

The handler only records the signal; the training loop reads that Python attribute after each
optimizer step (no device synchronisation), so the step in flight completes and the checkpoint it
writes is consistent. A second signal exits at once: checkpoints are written to a temporary file
and renamed, so an exit at any instant leaves the previous one intact.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_previous_hook, _previous_unraisable = sys.excepthook, sys.unraisablehook  # replaced by catch_interrupts_from_start


class StopOnSignal:
    """While entered (main thread only: Python delivers signals there), SIGINT and SIGTERM set
    `signum` instead of raising; the previous handlers come back on exit."""

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # the user insists: the last checkpoint on disk is whole, so just go
            sys.stderr.write(f"interrupted again ({signal.Signals(signum).name}): exiting now\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signum = signum


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's kill) raised where Ctrl-C raises KeyboardInterrupt, so both take one path."""

    signum = signal.SIGTERM


_terminated = False  # whether raise_terminated has run in this process: see was_terminated


def raise_terminated(signum, frame):
    """A SIGTERM handler: raise `Terminated` where the signal lands."""
    global _terminated
    _terminated = True
    raise Terminated()


def was_terminated() -> bool:
    """Whether a SIGTERM was raised as `Terminated`: Typer turns every KeyboardInterrupt escaping a command into
    exit code 130, Ctrl-C's, and this tells the CLI that it was SIGTERM's (143)."""
    return _terminated


@contextmanager
def sigterm_as_interrupt():
    """While entered (main thread only), SIGTERM raises `Terminated`, a KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupt_exit_code(err: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM, as a shell reports a process killed by either."""
    return 128 + getattr(err, "signum", signal.SIGINT)


def _interruption(error: BaseException | None) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (a KeyboardInterrupt) that `error` is or was caused by: Python wraps one that
    lands in a class's `__set_name__` (dataclasses, at import) in a RuntimeError."""
    for _ in range(100):  # a chain is short; the bound only guards against a cycle
        if error is None or isinstance(error, KeyboardInterrupt):
            return error
        error = error.__cause__ or error.__context__
    return None


def _interrupted_at_start(kind, value, traceback) -> None:
    """Ctrl-C or SIGTERM while the command is still importing (before `main` runs), or during a command's
    own imports: one line, not a traceback."""
    interrupt = _interruption(value)
    if interrupt is not None:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        os._exit(128 + getattr(interrupt, "signum", signal.SIGINT))
    _previous_hook(kind, value, traceback)


def _interrupt_in_callback(unraisable) -> None:
    """A Ctrl-C or SIGTERM that lands where Python cannot raise (a weakref callback, such as the import
    system's module-lock cleanup; a __del__) is printed as "Exception ignored in: ..." with a traceback and
    dropped, and the command runs on as if never interrupted. The signal is sent again a moment later, from
    another thread: sent from here, its handler would run inside this hook and be dropped the same way."""
    interrupt = _interruption(unraisable.exc_value)
    if interrupt is None:
        _previous_unraisable(unraisable)
        return
    signum = getattr(interrupt, "signum", signal.SIGINT)
    try:
        again = threading.Timer(0.01, signal.pthread_kill, (threading.main_thread().ident, signum))
        again.daemon = True
        again.start()
    except RuntimeError:  # no new thread at interpreter shutdown: end as an interrupted command ends
        _interrupted_at_start(KeyboardInterrupt, interrupt, None)


def catch_interrupts_from_start() -> None:
    """Called first by the `mlptrain` command, before its heavy imports: a Ctrl-C or SIGTERM from here on is
    one line, never a traceback, and SIGTERM (a scheduler's kill, `timeout`) takes Ctrl-C's path in every
    command: one line, exit 143, the atomic writes' temporary files removed (its default action killed
    evaluate, predict, export, svm ... silently)."""
    global _previous_hook, _previous_unraisable
    _previous_hook, sys.excepthook = sys.excepthook, _interrupted_at_start
    _previous_unraisable, sys.unraisablehook = sys.unraisablehook, _interrupt_in_callback
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_terminated)
