"""A packed lane's epoch end queued on the device at once, and finished on the host during the next epoch.

A lockstep group of lanes (mlptrain.packing.lane_group) ends every lane's epoch at one flush, and its next flush
waits for every lane's next window. So the host's epoch-end work of all the lanes in turn (the epoch's last
reads, its training means, the evaluation's reads and confusion matrices, the checkpoint's copies: a few ms a
lane) kept the GPU idle at each epoch's end, ~0.1 s of a 16-lane sweep's epoch end on an H200
(benchmarks/NOTES.md, issue 30 steps 11-12). Where nothing decided at an epoch's end changes the next epoch
(`ends_later`), a lane instead queues only its epoch end's device work (`queue_end`: host copies of the epoch's
per-sample rows and of the step state, the evaluation and host copies of its rows, host copies of the
checkpoint's arrays) and hands in the next epoch's windows at once, waiting for none of its epoch's reads. The
host's part comes during the next epoch: the epoch's last two reads are reported at its first read (from their
own host copies: mlptrain.training.reads), then the record (`record`), its logs, the best checkpoint
held or dropped and the caller's on_evaluation, each lane at another read. The copies are queued before the next
epoch's steps on the lanes' stream, so they hold what the epoch's end left: the records, checkpoints and bits of
an epoch end done at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlptrain.backends.host_copies import PINNED_LIMIT
from mlptrain.training.resume import device_arrays


def queues_ends(s, evaluation_stops: bool) -> bool:
    """Whether some epoch ends of `s` may be queued (ends_later says which): a
    lane of a lockstep group (staggered lanes end their epochs while the others step), where nothing its
    epoch end decides changes the next epoch (no early stopping, plateau schedule, or caller's on_evaluation
    that may stop the run: a sweep's pruning), and the group's queued copies leave pinned memory to spare
    (past it they would be made at once, the host waiting: mlptrain.backends.host_copies)."""
    group, train = getattr(s.window, "group", None), s.config.train
    if group is None or group.stagger or s.stopping is not None or s.plateau is not None or evaluation_stops:
        return False
    if train.epochs < 2 or train.checkpoint_every_epochs < 2:
        return False
    held = sum(array.nbytes for array in device_arrays(s.model, s.step))  # a held best and the epoch's copies
    return 2 * group.lanes * held <= PINNED_LIMIT // 2


def ends_later(s, epoch: int) -> bool:
    """Whether epoch `epoch`'s end is queued and finished during the next epoch (where queues_ends allows):
    where no checkpoint is due at it (logs_later) and the epoch ran whole in this process."""
    return logs_later(s, epoch) and s.window.rows_known


def queued_copies(s) -> list[list]:
    """The arrays of each host copy a queued epoch end makes (queue_end), for their pinned memory to be made
    while the first epoch trains: ~1 ms a MB on the GPU machine, which a lockstep group's lanes would otherwise
    pay in turn at its first epoch ends."""
    copies = [device_arrays(s.model, s.step), epoch_rows(s)]
    for split in (s.val, s.test if s.config.train.eval_test == "every_epoch" else None):
        if split is not None and split.size:
            copies.append(s.evaluator.split_rows(split))
    return copies


def epoch_rows(s) -> list:
    """What queue_end copies of the epoch's training: its per-sample losses and outcomes, and the step state."""
    return [s.window.row_loss[:s.train.size], s.window.row_correct[:s.train.size], s.step.state]


def logs_later(s, epoch: int) -> bool:
    """Whether epoch `epoch`'s logging (its console line, TensorBoard scalars and metrics.jsonl record: ~2 ms of
    host work) waits for one of the next epoch's reads: where nothing is written at its end that the record must
    come before (no checkpoint is due: not the last epoch, not a checkpoint epoch, no early stopping) and a
    packed lane's host time counts (its group's GPU waits for each lane's epoch end in turn; spread over the
    next epoch's reads, the logging runs while the GPU steps)."""
    train = s.config.train
    return (getattr(s.window, "lane", None) is not None and epoch < train.epochs
            and epoch % train.checkpoint_every_epochs != 0 and s.stopping is None)


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
    rows = s.backend.to_host_later(epoch_rows(s))
    ready = s.backend.mark()
    splits = s.evaluator.queue_record(s.val, test)
    checkpoint = s.backend.to_host_later(device_arrays(s.model, s.step))
    return QueuedEnd(epoch, reads, since, rows, ready, test, splits, checkpoint)


def record(s, end: QueuedEnd) -> dict:
    """The epoch's evaluation record with its training means, as an epoch end done at once gives it."""
    losses, outcomes, state = end.rows.take()
    evaluator = s.evaluator
    means = evaluator.row_metrics(losses, outcomes)[:2] if s.train.size else (None, None)
    return evaluator.record_from(end.splits, end.epoch, s.step.decoded(state)["steps"], evaluator.train_record(*means))
