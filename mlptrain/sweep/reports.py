"""A trial's per-epoch reports to Optuna (`trial.report`) written behind its training, where nothing waits for
them: a sweep that does not prune asks nothing back after a report. Each costs ~2.6 ms on the GPU machine (the
journal file's lock, write and fsync), which the lanes of a packed sweep (mlptrain.packing.lane_group) paid in
turn at every epoch's end while the GPU idled. One thread per process writes them in the order they came, and a
trial waits for its own before the study is told its outcome, so the study records what it recorded before.
A sweep that prunes reports at once: its pruner decides from the report."""

from __future__ import annotations

from concurrent.futures import Future

from mlptrain.util.background import pool


class Reports:
    """The reports of one trial: `add` queues one, `wait` returns once all are written (raising the first
    error one of them met), `settle` waits without raising (the trial failed already)."""

    def __init__(self, trial):
        self.trial = trial
        self.pending: list[Future] = []

    def add(self, value: float, epoch: int) -> None:
        self.pending.append(pool("reports", 1).submit(self.trial.report, value, epoch))

    def wait(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()

    def settle(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.exception()
