"""An epoch's metric reads (training.loop.epoch_steps): each queued after a period's steps (host copies of the
period's per-sample rows and of the step state, on their way, and a backend mark), and reported a period later to
the loop's `on_read` (mlptrain.training.monitor), so that the host reads one period's results while the next
period's steps are queued.

The copies are queued with the read (Backend.to_host_later), not made when it is reported: a report then waits
for no copy. Made at the report, each lane of a packed group waited for three copies in turn, and the device copy
of the step state that queued each read took more: in a 16-lane sweep's flush gaps over 5 ms (the GPU out of
queued steps), the thread feeding it was in those copies in 615 of 1,462 samples (benchmarks/NOTES.md, issue 30
step 16)."""

from __future__ import annotations

import dataclasses
import time

from mlptrain.training.queued_end import QueuedEnd


@dataclasses.dataclass(frozen=True)
class QueuedRead:
    """A read queued after the steps of samples [lo, hi) of the epoch: host copies of their per-sample losses
    (and outcomes) and of the step state are on their way (`copies`), and `mark` says when the steps are done."""

    epoch: int
    step_in_epoch: int
    lo: int
    hi: int
    mark: object
    copies: object  # Backend.to_host_later's: the rows' losses, their outcomes (a classifier's), the step state


def queue_read(s, epoch: int, i: int, lo: int, hi: int) -> QueuedRead:
    copies = s.window.read_copies(lo, hi, s.evaluator.classifies)
    # the copies' own mark where they have one: after them, so after the period's steps. A packed group's lanes
    # share their reads' copies (LaneGroup.read_copies), so they share one event where each recorded its own and
    # side_by_side asked each in turn whether it was done: ~250 ms of a 16-lane sweep's feeding thread, which the
    # GPU waits for (benchmarks/NOTES.md, issue 30 step 29)
    mark = copies.mark if copies.mark is not None else s.backend.mark()
    return QueuedRead(epoch, i + 1, lo, hi, mark, copies)


def read_state(s, read: QueuedRead) -> dict:
    """The step state as the read's steps left it (OptimizerStep.read's keys)."""
    return s.step.decoded(read.copies.take()[-1])


def report(s, read: QueuedRead, reported: float, on_read) -> float:
    """Hand `on_read` the metrics of a queued read (waiting for its copies where they are not done yet); returns
    the time of this report, from which the next one's seconds count."""
    loss, acc = _rows_read(s, read)
    now = time.perf_counter()
    _hand(read, loss, acc, read_state(s, read), now - reported, on_read)
    return now


def report_late(s, end: QueuedEnd, on_read) -> float:
    """`report` of a queued epoch end's last reads (mlptrain.training.queued_end). The seconds from the epoch's
    report before them to now, a period into the next epoch (so the epoch's end and that period too), are shared
    by their samples; the next report's seconds count from now."""
    now = time.perf_counter()
    samples = sum(read.hi - read.lo for read in end.reads)
    for read in end.reads:
        loss, acc = _rows_read(s, read)
        seconds = (now - end.since) * (read.hi - read.lo) / samples
        _hand(read, loss, acc, read_state(s, read), seconds, on_read)
    return now


def _rows_read(s, read: QueuedRead) -> tuple[float, float]:
    return s.window.read_metrics(read.copies, s.evaluator.row_metrics)


def _hand(read: QueuedRead, loss: float, acc: float, state: dict, seconds: float, on_read) -> None:
    on_read({"epoch": read.epoch, "step_in_epoch": read.step_in_epoch, "step": state["steps"], "lr": state["lr"],
             "grad_norm": state["grad_norm"], "loss_scale": state["loss_scale"], "skipped": state["skipped"],
             "loss": loss, "acc": acc, "samples": read.hi - read.lo, "seconds": seconds})
