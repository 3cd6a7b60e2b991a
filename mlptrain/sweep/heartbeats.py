"""The heartbeats of the trials this process trains, beaten by one thread.

A trial beats every HEARTBEAT_S while it trains (mlptrain.sweep.liveness says why). A thread a trial cost a
thread's start at the trial's start and a join at its end: a packed worker starts 16 trials, and ends them,
one after another on the thread that feeds their lanes, and each start or join there waited for the new or
ending thread to get the interpreter from the busy ones (benchmarks/NOTES.md, issue 30 step 22). One thread
beats for all of them, each on its own schedule: HEARTBEAT_S after its start, then after each beat.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from mlptrain.sweep import claims
from mlptrain.sweep.liveness import GRACE_S, HEARTBEAT_S
from mlptrain.util.console import console


@dataclass
class _Trial:
    storage: object
    trial_id: int
    due: float  # time.monotonic() of its next beat
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while it beats
    beating: bool = True  # False once it has left: no beat starts after that
    warned: bool = False


class Heartbeats:
    """`beating(storage, trial_id)`: the trial beats every `every` seconds from one thread while inside."""

    def __init__(self, every: float = HEARTBEAT_S):
        self.every = every
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked worker starts with no trials and no thread

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._trials: dict[int, _Trial] = {}  # by id(): the same trial id may come from two storages
        self._thread: threading.Thread | None = None

    @contextmanager
    def beating(self, storage, trial_id: int):
        trial = _Trial(storage, trial_id, time.monotonic() + self.every)
        key = id(trial)  # held in the dict, so no other object takes its id while it is there
        with self._changed:
            self._trials[key] = trial
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="mlptrain-heartbeats")
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                del self._trials[key]
            with trial.lock:  # a beat under way ends first; none starts after this
                trial.beating = False

    def _run(self) -> None:
        while True:
            with self._changed:
                trial = min(self._trials.values(), key=lambda t: t.due, default=None)
                wait = None if trial is None else trial.due - time.monotonic()
                if wait is None or wait > 0:
                    self._changed.wait(wait)
                    continue
                trial.due = time.monotonic() + self.every
            with trial.lock:
                if trial.beating:
                    self._beat(trial)

    @staticmethod
    def _beat(trial: _Trial) -> None:
        try:
            claims.beat(trial.storage, trial.trial_id)
        except Exception as err:  # a busy database: a missed beat matters only after GRACE_S of them
            if not trial.warned:
                console.print(f"[yellow]warning:[/] the trial's heartbeat failed ({type(err).__name__}: "
                              f"{err}); after {GRACE_S} s without one, other workers take the trial over")
                trial.warned = True


HEARTBEATS = Heartbeats()
