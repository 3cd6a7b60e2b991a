"""A packed lane's epoch end queued on the device at once, and finished on the host during the next epoch.

A lockstep group of lanes (mlptrain.packing.lane_group) ends every lane's epoch at one flush, and its next flush
waits for every lane's next window. So the host's epoch-end work of all the lanes in turn (the epoch's last read,
its training means, the evaluation's reads and confusion matrices, the checkpoint's copies: a few ms a lane)
kept the GPU idle at each epoch's end, ~0.1 s of a 16-lane sweep's epoch end on an H200 (benchmarks/NOTES.md,
issue 30 step 11). Where nothing decided at an epoch's end changes the next epoch (training.loop's
`_ends_later`), a lane instead queues only its epoch end's device work, `queue_end`: host copies of the epoch's
per-sample rows and of the step state, the evaluation and host copies of its rows, host copies of the
checkpoint's arrays; then it hands in the next epoch's windows at once, not waiting for the epoch's last two reads
either. The host's part comes during the next epoch: those reads are reported at its first read (`late_rows`,
their step state from OptimizerStep.keep's two slots), the record (`record`), its logs, the best
checkpoint held or dropped and the caller's on_evaluation later, each lane at another read. The copies are
queued before the next epoch's steps on the lanes' stream, so they hold what the epoch's end left: the records,
checkpoints and bits of an epoch end done at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlptrain.training.resume import device_arrays


@dataclass(frozen=True)
class QueuedEnd:
    """An epoch end's device work, queued (`queue_end`)."""

    epoch: int
    reads: tuple  # the epoch's last reads (training.loop), not reported yet: epoch, step, rows [lo, hi), state
    since: float  # the time their reports' seconds count from: the epoch's report before them
    rows: object  # host copies on their way: the epoch's per-sample losses and outcomes, the step state
    ready: object  # a backend mark after those copies (None on the CPU, whose copies are made at once)
    test: object  # the test split when the record includes it, else None
    splits: list  # the evaluation, queued (Evaluator.queue_record)
    checkpoint: object  # host copies of the checkpoint's device arrays (resume.device_arrays) at the epoch's end


def queue_end(s, epoch: int, reads: tuple, since: float, test) -> QueuedEnd:
    """Queue session `s`'s end of epoch `epoch`, whose last `reads` are queued and not reported."""
    size = s.train.size
    rows = s.backend.to_host_later([s.window.row_loss[:size], s.window.row_correct[:size], s.step.state])
    ready = s.backend.mark()
    splits = s.evaluator.queue_record(s.val, test)
    checkpoint = s.backend.to_host_later(device_arrays(s.model, s.step))
    return QueuedEnd(epoch, reads, since, rows, ready, test, splits, checkpoint)


def late_rows(s, end: QueuedEnd, read) -> tuple[float, float]:
    """One of the epoch's last reads: the mean loss and accuracy of its rows [read.lo, read.hi)."""
    losses, outcomes, _ = end.rows.take()
    loss, acc, _ = s.evaluator.row_metrics(losses[read.lo:read.hi],
                                           outcomes[read.lo:read.hi] if s.evaluator.classifies else None)
    return loss, acc


def record(s, end: QueuedEnd) -> dict:
    """The epoch's evaluation record with its training means, as an epoch end done at once gives it."""
    losses, outcomes, state = end.rows.take()
    evaluator = s.evaluator
    means = (evaluator.row_metrics(losses, outcomes if evaluator.classifies else None)[:2] if s.train.size
             else (None, None))
    return evaluator.record_from(end.splits, end.epoch, s.step.decoded(state)["steps"], evaluator.train_record(*means))
