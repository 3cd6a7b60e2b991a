"""Ctrl-C, SIGTERM and SIGHUP: one line and the right exit code in every command, from the first import on; during
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

from mlptrain.util.interrupts import interruption

# SIGHUP (the terminal closed, an ssh session dropped) takes SIGTERM's path: its default action killed the
# process where it stood, leaving the atomic writes' temporary files and an unresumable run behind
HANGUPS = (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()
SIGNALS = (signal.SIGINT, signal.SIGTERM, *HANGUPS)
_previous_hook, _previous_unraisable = sys.excepthook, sys.unraisablehook  # replaced by catch_interrupts_from_start


class StopOnSignal:
    """While entered (main thread only: Python delivers signals there), SIGINT, SIGTERM and SIGHUP set
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
    """SIGTERM (a scheduler's kill) or SIGHUP raised where Ctrl-C raises KeyboardInterrupt, so all take one
    path; `signum` says which."""

    signum = signal.SIGTERM

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__()
        self.signum = signum


_terminated: int | None = None  # the signal raise_terminated last raised in this process: see was_terminated


def raise_terminated(signum, frame):
    """A SIGTERM (or SIGHUP) handler: raise `Terminated` where the signal lands."""
    global _terminated
    _terminated = signum
    raise Terminated(signum)


def was_terminated() -> int | None:
    """The signal (SIGTERM, SIGHUP) raised as `Terminated`, if any: Typer turns every KeyboardInterrupt escaping
    a command into exit code 130, Ctrl-C's, and this tells the CLI that it was another's (143, 129)."""
    return _terminated


@contextmanager
def sigterm_as_interrupt():
    """While entered (main thread only), SIGTERM and SIGHUP raise `Terminated`, a KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, raise_terminated) for sig in (signal.SIGTERM, *HANGUPS)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interrupt_exit_code(err: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP, as a shell reports a process killed by each."""
    return 128 + getattr(err, "signum", signal.SIGINT)


def _interrupted_at_start(kind, value, traceback) -> None:
    """Ctrl-C or SIGTERM while the command is still importing (before `main` runs), or during a command's
    own imports: one line, not a traceback."""
    interrupt = interruption(value)
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
    interrupt = interruption(unraisable.exc_value)
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
        for sig in (signal.SIGTERM, *HANGUPS):
            if sig in HANGUPS and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started under nohup: the hangup is meant to pass unnoticed
            signal.signal(sig, raise_terminated)
