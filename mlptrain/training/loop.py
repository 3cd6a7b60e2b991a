"""The training loop.

An epoch is a sequence of windows of `batch_size * grad_accum_steps` samples taken in the epoch's order
(a function of seed and epoch only, so the windows do not depend on how they are split); each window is
ONE optimizer step (mlptrain.training.window). Per-sample losses and hits land in device buffers indexed by
position in the epoch; the host reads them, and the step state, every `train.log_every` optimizer steps
(mlptrain.training.monitor): the loop's only synchronisation. After each epoch: evaluation (mlptrain.training.evaluation),
checkpoints, and at the end the run summary (mlptrain.training.summary).

Checkpoints record the position (epoch, window) and everything that evolves, so a run stopped by
Ctrl-C or SIGTERM (after the step in flight) resumes bitwise where it stopped: see mlptrain.training.resume.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
from rich.markup import escape

from mlptrain.data.loader import epoch_order
from mlptrain.errors import TrainingDiverged, TrainingInterrupted, UserError
from mlptrain.run_dirs.folders import write_yaml
from mlptrain.run_dirs.links import checkpoint_file
from mlptrain.run_dirs.lock import check_space
from mlptrain.run_dirs.records import RunLogger, is_evaluation_record, read_metrics
from mlptrain.training.checkpoint import load_checkpoint
from mlptrain.training.checkpoint_writes import (checkpoint_at, discard_best_ahead, discard_stale_ahead, write_best_ahead,
                                                write_checkpoints, written)
from mlptrain.training.compilation import compile_kernels, kernel_records
from mlptrain.training.diagnosis import learning_warning, likely_cause
from mlptrain.training.experiment import data_root, run_config
from mlptrain.training.fallbacks import warn
from mlptrain.training.hparams import hparam_values, write_session
from mlptrain.training.monitor import TrainingMonitor
from mlptrain.training.queued_end import QueuedEnd, ends_later, logs_later, queue_end, queued_copies, queues_ends
from mlptrain.training.queued_end import record as queued_record
from mlptrain.training.reads import queue_read, read_state, report, report_late
from mlptrain.training.steps import Period, finish
from mlptrain.training.resume import Position, Resume, device_arrays, restore
from mlptrain.training.session import Session
from mlptrain.training.run_end import close_run
from mlptrain.training.summary import run_summary
from mlptrain.util.background import Waitable
from mlptrain.util.console import console


def train(s: Session, run_dir: Path, on_evaluation=None, resume: Resume | None = None, stop=None,
          records: dict | None = None, progress: bool = True, evaluation_stops: bool = True) -> dict:
    """Train, evaluate each epoch, checkpoint, and return the summary written to summary.json: `training`'s
    steps run to their end."""
    return finish(training(s, run_dir, on_evaluation, resume, stop, records, progress, evaluation_stops))


def training(s: Session, run_dir: Path, on_evaluation=None, resume: Resume | None = None, stop=None,
             records: dict | None = None, progress: bool = True, evaluation_stops: bool = True):
    """A generator: it yields after queueing each optimizer step, and returns the summary written to
    summary.json. Several runs advanced in turn from one thread train side by side (mlptrain.packing.side_by_side);
    `train` runs one to its end.

    `on_evaluation(record)`, when given, is called after each epoch's evaluation with the record
    written to metrics.jsonl (epoch, step, val_* metrics, test_* ones as train.eval_test says); an
    exception it raises stops the run there (a sweep prunes a trial this way) after that epoch's
    checkpoint is written. `evaluation_stops` false: it never raises (a sweep that does not prune), so a packed
    lane's epoch end may be finished during the next epoch (mlptrain.training.queued_end).
    `resume` continues from a checkpoint of this run (mlptrain.training.resume.prepare_resume). When
    `stop.signum` becomes set, the loop writes `last` after the current optimizer step and raises
    TrainingInterrupted. `records` are extra summary fields. On a resumed run `wall_s` covers the resumed
    part, `wall_s_total` the whole run. With train.early_stopping the run may end before train.epochs,
    with the best epoch's parameters restored. `progress`: the progress bar (a sweep training several
    trials at once shows none: a terminal holds one)."""
    s.stop = stop
    # last, best and a temporary; and a best written ahead where `last` waits for epochs (checkpoint_writes)
    held = s.config.train.checkpoint_every_epochs > 1
    check_space(run_dir, (4 if held else 3) * checkpoint_bytes(s) + 2**20, "its checkpoints")
    discard_stale_ahead(run_dir)
    start = _resume(s, resume, run_dir) if resume is not None else Position()
    _announce(s, run_dir)
    records = {**compile_kernels(s), **(records or {})}
    queues = queues_ends(s, on_evaluation is not None and evaluation_stops)
    if s.config.train.checkpoint_every_epochs > 1:  # the best epoch's checkpoint is held for epochs: its memory
        # made while the first epoch trains; and that of an epoch end's copies, queued while the held one waits;
        # and a buffer for each later epoch's order (TrainingWindow.start_epoch: the first finds none, and copies
        # from pageable memory, as nothing is queued yet)
        s.backend.reserve_host_copies(device_arrays(s.model, s.step), *(queued_copies(s) if queues else []),
                                      [s.window.order])
    mlflow = start_mlflow(s, run_dir)
    if mlflow is None:
        return (yield from _train(s, run_dir, on_evaluation, resume, start, records, progress, queues))
    with mlflow.ending(run_dir):  # the MLflow run's status: FINISHED, KILLED (stopped) or FAILED
        return (yield from _train(s, run_dir, mlflow.watching(on_evaluation), resume, start, records, progress,
                                  queues, mlflow))


def _train(s: Session, run_dir: Path, on_evaluation, resume: Resume | None, start: Position, records: dict,
           progress: bool, queues: bool, mlflow=None) -> dict:
    """train()'s epochs, evaluations, checkpoints and summary, from `start`, logged by a RunLogger (and to
    `mlflow`, an mlptrain.run_dirs.mlflow_log.MlflowLog, when given); `queues`: epoch ends may be queued
    (queued_end.ends_later)."""
    logger = RunLogger(run_dir, mlflow, named=not progress, draw_apart=draws_apart(s, progress),
                       on_fallback=s.notes.append)  # no bar: other runs print beside this one
    logger.chart_layout(s.classifies)
    closing = None  # the run's last files on their way (run_end.close_run)
    try:
        with TrainingMonitor(logger, s.config, s.steps_per_epoch, s.classifies, start.epoch, start.window,
                             progress) as monitor:
            finished = resume is not None and resume.finished  # killed after its last checkpoint: only the summary
            best, stopped = start, finished and start.epoch < s.config.train.epochs  # finished by early stopping
            last = _last_record(s, run_dir, start, logger) if finished else {}
            yield Period(s.steps_per_epoch)  # packed runs spread their epochs' ends (mlptrain.packing.side_by_side)

            def finish_end(end: QueuedEnd) -> None:
                """A queued epoch end's host part (queued_end.ends_later), as an epoch end done at once does it."""
                nonlocal last, best
                last = queued_record(s, end)
                s.evaluator.log_epoch(last, logger, end.test)
                best, _ = _after_evaluation(s, run_dir, last, best, end.checkpoint)
                if on_evaluation is not None:
                    on_evaluation(last)
                if end.test is None:  # the test split's pass at the run's end replays a graph captured now, while
                    s.evaluator.capture_ahead(s.test)  # the GPU trains, instead of launching it batch by batch

            # the last epoch's logging, or its whole queued end, done inside this one (logs_later, ends_later);
            # `late`: that queued end, whose last reads are not reported yet
            pending, late = None, None
            for epoch in range(start.epoch + 1, s.config.train.epochs + 1) if not finished else ():
                queued = queues and ends_later(s, epoch)
                done = yield from epoch_steps(s, epoch, monitor, start.window if epoch == start.epoch + 1 else 0,
                                              pending, late, queued)
                pending, late = None, None
                if done < s.steps_per_epoch:
                    monitor.stopped_at(done)
                    _stop(s, run_dir, Position(epoch - 1, done, best.best, best.best_epoch))
                if queued:  # its device work queued now, the rest during the next epoch
                    late = queue_end(s, epoch, *s.window.unreported, _test_split(s, epoch))
                    pending = functools.partial(finish_end, late)
                    s.window.rows_known = True
                    if s.stop_requested:  # finished here: the epoch's record, then the checkpoint the stop writes
                        report_late(s, late, monitor)
                        pending()
                        _stop(s, run_dir, Position(epoch, 0, best.best, best.best_epoch))
                    continue
                # ahead of other packed runs' queued steps; each split's evaluation yields its mark, so that
                # they queue steps while it runs (mlptrain.packing.side_by_side), then it is read
                # read after the epoch's last read's mark, not the device's whole queue: packed lanes step on
                # beside this one's epoch end (mlptrain.packing.lane_group), and waiting for their steps would
                # leave the GPU idle while this lane's host work runs
                end, later = s.window.epoch_read, logs_later(s, epoch)
                with s.backend.urgent(end.mark):
                    means = s.evaluator.train_means(s.window.row_loss, s.window.row_correct, s.train.size,
                                                    s.window.rows_known, end.mark)
                    last = yield from s.evaluator.epoch_record_steps(
                        s.val, _test_split(s, epoch), epoch, lambda: read_state(s, end)["steps"],
                        logger, means, logged=not later)
                s.window.rows_known = True  # the next epoch runs whole in this process
                if later:
                    pending = functools.partial(s.evaluator.log_epoch, last, logger, _test_split(s, epoch))
                try:
                    best, stopped = _after_evaluation(s, run_dir, last, best)
                    if on_evaluation is not None:
                        on_evaluation(last)
                except BaseException:
                    if pending is not None:  # the epoch's record is written before its error, as when logged at once
                        pending()
                    raise
                if stopped:
                    break
                if s.stop_requested and epoch < s.config.train.epochs:
                    if pending is not None:  # the epoch's record before the checkpoint that follows it
                        pending()
                    _stop(s, run_dir, Position(epoch, 0, best.best, best.best_epoch))
        if s.writing is not None:  # packed runs go on while this one's last files are written
            yield Waitable(s.writing)
        written(s)
        trained, last = last["epoch"], _restore_best(s, run_dir, last, best)
        last = s.evaluator.test_at_end(s.test, last, logger)  # train.eval_test end, and a run that stopped early
        records = {"epochs": trained, "best_epoch": best.best_epoch, "stopped_early": stopped,
                   "restored_best": last["epoch"] != trained, "resumed": resume is not None, **records,
                   **kernel_records(s)}
        summary = run_summary(s, run_dir.name, last, best.best, monitor.throughput(), records)
        # said once the run is over (not per epoch: an early epoch may still be at chance), and recorded
        state = s.step.read()  # one read of the step state for the warning and the grad-norm record
        note = learning_warning(s.config, last, s.dataset, summary.get("mean_image_mse"), state)
        if note:  # named where other runs print beside this one; recorded as it is
            warn(logger.line(note))
        summary["warnings"] = [note] if note else []
        write_session(logger.events, hparam_values(s.config, s.backend.name, data_root(s.config)))
        closing = close_run(s, logger, run_dir, summary, state["windows"])
    except OSError as err:  # metrics.jsonl or TensorBoard's events on a full or read-only disk
        raise UserError(f"{run_dir}: cannot write to it ({err.strerror or err}); its last checkpoint is "
                        "intact") from None
    finally:
        if closing is None:  # the run failed: its logger closed here, the checkpoint on its way still written
            logger.close()
            discard_best_ahead(s)
            if s.writing is not None:
                s.writing.exception()
    yield Waitable(closing)  # packed runs go on while this one's last files are written
    return closing.result()


def draws_apart(s: Session, progress: bool) -> bool:
    """Whether the run's TensorBoard images are drawn in processes of their own (mlptrain.run_dirs.drawing):
    where several runs train at once (no bar) on a GPU, whose thread that feeds it needs the interpreter."""
    return not progress and s.backend.name != "cpu"


def start_mlflow(s: Session, run_dir: Path):
    """The run's MLflow log (mlptrain.run_dirs.mlflow_log) when logging.mlflow is on, else None; raises
    UserError when MLflow cannot be used. A failure later is recorded among the run's fallbacks."""
    if not s.config.logging.mlflow:
        return None
    # imported on first use: only runs that log to MLflow need it
    from mlptrain.run_dirs.mlflow_log import MlflowLog

    return MlflowLog.start(run_dir, s.config.logging, hparam_values(s.config, s.backend.name, data_root(s.config)),
                           on_failure=s.notes.append)


def train_epoch(s: Session, epoch: int, on_read, first_window: int = 0) -> int:
    """`epoch_steps` run to the epoch's end."""
    return finish(epoch_steps(s, epoch, on_read, first_window))


def epoch_steps(s: Session, epoch: int, on_read, first_window: int = 0, pending=None, late: QueuedEnd | None = None,
                end_later: bool = False):
    """The optimizer steps of one epoch from window `first_window` (a resumed run's position) on, a generator
    that yields after queueing each (a packed lane's window, `s.window.spans`: each run of windows up to the
    next read, `window_spans`). Each `train.log_every` steps, and at the epoch's end, a read of the
    per-sample losses since the last read and of the step state is queued (a copy of the state and a mark
    of the backend, Backend.mark); `on_read` gets it at the next read's turn or at the epoch's end (each
    yields the read's mark first: packed runs, mlptrain.packing.side_by_side, queue steps while it is not ready),
    a dict of epoch, step_in_epoch, step (optimizer steps applied), lr, grad_norm, loss_scale, skipped, loss,
    acc, samples and seconds. So the host waits for the device only at an epoch's end: while it reads one
    period's results, the next period's steps are queued. Returns the windows done: fewer than
    `s.steps_per_epoch` when a stop was requested. `pending`: the last epoch's logging (logs_later), called
    after this epoch's read number `lane` (a packed group's lanes in turn, while the GPU steps), and at the
    latest before this one returns or raises. `late`: the last epoch's end, queued (ends_later), whose last reads
    are reported at this epoch's first read, before this epoch's. `end_later`: the epoch's end waits for nothing:
    its last two reads are queued and not reported, and `s.window.unreported` holds (those reads, the time their
    seconds count from)."""
    config, window = s.config, s.config.train.effective_batch_size
    ahead = s.window.order_ahead
    s.window.start_epoch(ahead[1] if ahead is not None and ahead[0] == epoch else
                         epoch_order(s.train, config.seed, epoch))
    reported, read_from, queued, reads, held = time.perf_counter(), first_window * window, None, 0, None
    # the read after which `pending` runs: the lanes of a group spread over the epoch's reads but its last
    reads_between = max(-(-(s.steps_per_epoch - first_window) // config.train.log_every) - 1, 1)
    done, turn = s.steps_per_epoch, getattr(s.window, "lane", 0) % reads_between
    ahead_at = min(s.steps_per_epoch, (first_window // config.train.log_every + 1) * config.train.log_every)
    try:
        for begin, i in window_spans(first_window, s.steps_per_epoch, config.train.log_every, s.window.spans):
            for j in range(begin, i + 1):  # the span's windows handed in, then one yield
                start = j * window
                rows = min(window, s.train.size - start)
                s.window.run(start, rows)
            if i + 1 == ahead_at and epoch < config.train.epochs:
                # the next epoch's order while the GPU trains this one's queued windows: made at the epoch's
                # start, it kept the GPU idle (~1.8 ms an H200 host's; benchmarks/NOTES.md, issue 31 step 7); at its
                # last window, a packed group's lanes made theirs in turn at the epoch's end, ~0.2 ms each (issue 30
                # step 33): at its first read, the host is a period ahead of the GPU
                s.window.order_ahead = (epoch + 1, epoch_order(s.train, config.seed, epoch + 1))
            yield
            dropped = s.window.withdraw() if s.stop_requested else 0
            if dropped:  # a stop while the group launched the span: it launched no more, so the stop lands here
                done = i + 1 - dropped
                break
            if (i + 1) % config.train.log_every == 0 or i + 1 == s.steps_per_epoch:
                if late is not None:  # a period into this epoch: long done
                    yield late.ready
                    end, late = late, None
                    try:
                        reported = report_late(s, end, on_read)
                    except BaseException:  # a diverged loss: the epoch's record is not written, as at once
                        pending = None
                        raise
                if queued is not None and end_later and i + 1 == s.steps_per_epoch:
                    held = queued  # not waited for either: reported with the last (QueuedEnd.reads)
                elif queued is not None:  # a period old: packed runs queue their steps while it is not ready yet
                    yield queued.mark
                    reported = report(s, queued, reported, on_read)
                    reads += 1
                    if pending is not None and reads > turn:
                        pending, done_logging = None, pending
                        done_logging()
                queued = queue_read(s, epoch, i, read_from, start + rows)
                read_from = start + rows
            if s.stop_requested and i + 1 < s.steps_per_epoch:  # a Python attribute: no synchronisation
                done = i + 1
                break
        if end_later and done == s.steps_per_epoch:
            s.window.epoch_read = queued
            s.window.unreported = ((queued,) if held is None else (held, queued), reported)
            return done
        if queued is not None:
            yield queued.mark
            report(s, queued, reported, on_read)
    finally:
        if late is not None:  # a stop or an error before this epoch's first read: the last epoch's end first
            report_late(s, late, on_read)  # raising (a diverged loss), the epoch's record is not written, as at once
        if pending is not None:  # fewer reads than lanes, a stop, an error: the record is written first
            pending()
    s.window.epoch_read = queued
    return done


def window_spans(first: int, count: int, log_every: int, spans: bool):
    """(first window, last window) of each run of windows [first, count) that epoch_steps hands in before it
    yields once: one window each, or with `spans` (TrainingWindow.spans) every window up to the next read (each
    `log_every`-th, and the epoch's last), which is where the loop next needs the host between two windows."""
    begin = first
    while begin < count:
        last = min(count, (begin // log_every + 1) * log_every) - 1 if spans else begin
        yield begin, last
        begin = last + 1


def _resume(s: Session, resume: Resume, run_dir: Path) -> Position:
    # before anything is written: a mismatched checkpoint changes nothing
    start = restore(resume, s.model, s.step, s.plateau, s.selection[0], s.steps_per_epoch)
    if start.window:
        s.window.restore_rows(resume.arrays)
    s.wall_before = start.wall_s
    write_yaml(run_dir / "config.yaml", run_config(s.config, s.dataset, s.backend.name))  # train.epochs may have grown
    console.print(f"resuming {run_dir} after epoch {start.epoch}"
                  f"{f' and {start.window} steps' if start.window else ''}")
    return start


def _last_record(s: Session, run_dir: Path, start: Position, logger) -> dict:
    """The evaluation record of the checkpoint's epoch, from metrics.jsonl (written before the checkpoint);
    evaluated again (the same parameters, so the same numbers) when the file lost it."""
    for record in reversed(read_metrics(run_dir)):
        if record.get("epoch") == start.epoch:
            if is_evaluation_record(record):  # it becomes the summary's: numbers, under the keys it has
                return record
            break
    return s.evaluator.epoch_record(s.val, _test_split(s, start.epoch), start.epoch, s.step.read()["steps"], logger)


def _test_split(s: Session, epoch: int):
    """The test split when epoch `epoch`'s evaluation includes it: every epoch's with train.eval_test
    every_epoch, else the last scheduled epoch's (a run that stops early is tested when it ends)."""
    return s.test if s.config.train.eval_test == "every_epoch" or epoch == s.config.train.epochs else None


def checkpoint_bytes(s: Session) -> int:
    """About what one checkpoint takes on disk: parameters, optimizer state, the per-step grad-norm record."""
    params = s.model.layout.size
    return 4 * params * (1 + len(s.step.optimizer.state)) + 8 * s.config.train.epochs * s.steps_per_epoch


def _announce(s: Session, run_dir: Path) -> None:
    """One warning line per fallback known so far, then the run's shape."""
    for note in s.fallbacks:
        warn(note)
    t = s.config.train
    batch = f"effective batch {t.effective_batch_size} (batch {t.batch_size} x {t.grad_accum_steps} accumulated)"
    if t.effective_batch_size > s.train.size:  # a window never holds more than the training set
        batch = (f"effective batch {s.train.size:,}, the whole training set (batch {t.batch_size} x "
                 f"{t.grad_accum_steps} accumulated asks {t.effective_batch_size:,})")
    console.print(f"[bold]{escape(run_dir.name)}[/]: {s.model.layout.size:,} parameters on {s.backend.device_name}, "
                  f"{t.precision}; {s.train.size:,} train / {s.val.size:,} val / {s.test.size:,} test; {batch}, "
                  f"{s.steps_per_epoch} optimizer step{'s' if s.steps_per_epoch != 1 else ''} per epoch",
                  highlight=False)  # Rich's number colouring: ~1 ms a line, paid by a packed sweep's lanes in turn


def _after_evaluation(s: Session, run_dir: Path, record: dict, best: Position, copies=None) -> tuple[Position, bool]:
    """Stop on a non-finite validation loss; step the plateau schedule; write the `last` checkpoint when due
    (every train.checkpoint_every_epochs, at the end, when stopping early) and with it `best`, when an epoch
    since the last one improved by more than train.early_stopping.min_delta (held in memory until then). Returns the best value
    so far of the selection metric with its epoch (as a Position's `best` and `best_epoch`), and whether
    early stopping ends the run here. `copies`: the checkpoint's device arrays copied at the epoch's end
    (a queued end, mlptrain.training.queued_end), used or dropped here."""
    epoch, step = record["epoch"], record["step"]
    val_loss = record["val_loss" if s.classifies else "val_mse"]
    if not np.isfinite(val_loss) and s.val.size:
        raise TrainingDiverged(f"the validation loss became {val_loss} after epoch {epoch} (optimizer step "
                               f"{step}); {likely_cause(s.config, s.step.read())}")
    if s.plateau is not None:  # before the checkpoint, which must hold the plateau's state after this epoch
        metric = s.config.schedule.metric if s.classifies else "val_mse"
        s.step.set_lr_factor(s.plateau.observe(record[metric]))
    (key, higher_is_better), delta = s.selection, s.config.train.early_stopping.min_delta
    value = record[key]
    if best.best is None or (value > best.best + delta if higher_is_better else value < best.best - delta):
        best = Position(epoch, 0, value, epoch)
    stopped = s.stopping is not None and epoch - best.best_epoch >= s.stopping.patience and epoch < s.config.train.epochs
    save_last = epoch % s.config.train.checkpoint_every_epochs == 0 or epoch == s.config.train.epochs or stopped
    if best.best_epoch == epoch and s.unsaved_best is not None:  # an earlier epoch's, never written: given up
        discard_best_ahead(s)
        s.unsaved_best.drop()  # first, so that the checkpoint below reuses its memory
        s.unsaved_best = None
    elif s.unsaved_best is not None and not save_last:  # it outlived an evaluation: likely the run's best
        write_best_ahead(s, run_dir)
    if save_last or best.best_epoch == epoch:
        held = checkpoint_at(s, Position(epoch, 0, best.best, best.best_epoch), copies)
        if best.best_epoch == epoch:  # kept until `last` is written: best.npz never runs ahead of it
            s.unsaved_best = held
        if save_last:
            write_checkpoints(s, run_dir, held)
    elif copies is not None:
        copies.drop()
    if stopped:
        console.print(f"early stopping after epoch {epoch}: {key} has not improved on epoch {best.best_epoch}'s "
                      f"{best.best:.6g} (by more than min_delta {delta:g}) in {epoch - best.best_epoch} "
                      "evaluation(s)")
    return best, stopped


def _restore_best(s: Session, run_dir: Path, last: dict, best: Position) -> dict:
    """With early stopping's restore_best, load `best` into the model (when a later epoch ended the run)
    and evaluate it: the run ends with, and its summary reports, the best epoch's parameters. Returns the
    evaluation record the summary reports."""
    if s.stopping is None or not s.stopping.restore_best or best.best_epoch in (0, last["epoch"]):
        return last
    s.model.load_parameters(load_checkpoint(checkpoint_file(run_dir, "best")), prefix="params/")
    record = s.evaluator.record(s.val, s.test, best.best_epoch, last["step"])
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if k not in ("epoch", "step"))
    console.print(f"restored the parameters of epoch {best.best_epoch} (checkpoints/best.npz): {metrics}")
    return record


def _stop(s: Session, run_dir: Path, position: Position) -> None:
    """Write `last` at `position` (after the optimizer step just finished), and `best` when it is pending, and
    raise TrainingInterrupted."""
    write_checkpoints(s, run_dir, checkpoint_at(s, position))
    written(s)  # the files whole before the stop is said
    # counted as the progress line counts: this epoch's optimizer steps, then the run's in all (fp16's
    # skipped steps included, as the bar counts them)
    steps = position.epoch * s.steps_per_epoch + position.window
    where = f"at epoch {position.epoch + 1}, after step {position.window} of its {s.steps_per_epoch}" \
        if position.window else f"after epoch {position.epoch}"
    raise TrainingInterrupted(f"interrupted {where} ({steps} optimizer steps in all); "
                              f"resume with: mlptrain run --resume {run_dir}", s.stop.signum)
