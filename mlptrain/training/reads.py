"""An epoch's metric reads (training.loop.epoch_steps): each queued after a period's steps (a copy of the step
state and a backend mark), and reported a period later to the loop's `on_read` (mlptrain.training.monitor), so
that the host reads one period's results while the next period's steps are queued."""

from __future__ import annotations

import dataclasses
import time

from mlptrain.training.queued_end import QueuedEnd, late_rows


@dataclasses.dataclass(frozen=True)
class QueuedRead:
    """A read queued after the steps of samples [lo, hi) of the epoch: their rows stay as they are until the
    epoch ends, the step state is copied (OptimizerStep.keep), and `mark` says when both are ready."""

    epoch: int
    step_in_epoch: int
    lo: int
    hi: int
    mark: object
    slot: int  # the step state's copy (OptimizerStep.read_kept)


def queue_read(s, epoch: int, i: int, lo: int, hi: int) -> QueuedRead:
    slot = s.step.keep()
    return QueuedRead(epoch, i + 1, lo, hi, s.backend.mark(), slot)


def report(s, read: QueuedRead, reported: float, on_read) -> float:
    """Hand `on_read` the metrics of a queued read (waiting for its mark where it is not done yet); returns the
    time of this report, from which the next one's seconds count."""
    loss, acc, _ = s.evaluator.read_rows(s.window.row_loss, s.window.row_correct, read.lo, read.hi, read.mark)
    state = s.step.read_kept(read.mark, read.slot)
    now = time.perf_counter()
    _hand(read, loss, acc, state, now - reported, on_read)
    return now


def report_late(s, end: QueuedEnd, on_read) -> float:
    """`report` of a queued epoch end's last reads (mlptrain.training.queued_end), their rows from its host
    copies. The seconds from the epoch's report before them to now, a period into the next epoch (so the epoch's
    end and that period too), are shared by their samples; the next report's seconds count from now."""
    now = time.perf_counter()
    samples = sum(read.hi - read.lo for read in end.reads)
    for read in end.reads:
        loss, acc = late_rows(s, end, read)
        seconds = (now - end.since) * (read.hi - read.lo) / samples
        _hand(read, loss, acc, s.step.read_kept(read.mark, read.slot), seconds, on_read)
    return now


def _hand(read: QueuedRead, loss: float, acc: float, state: dict, seconds: float, on_read) -> None:
    on_read({"epoch": read.epoch, "step_in_epoch": read.step_in_epoch, "step": state["steps"], "lr": state["lr"],
             "grad_norm": state["grad_norm"], "loss_scale": state["loss_scale"], "skipped": state["skipped"],
             "loss": loss, "acc": acc, "samples": read.hi - read.lo, "seconds": seconds})
