"""Ctrl-C and SIGTERM during training: finish the optimizer step, checkpoint, exit.

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
