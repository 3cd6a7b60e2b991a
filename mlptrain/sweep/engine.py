"""How a sweep's workers run its trials: each takes queued trials from a trial source (mlptrain.sweep.trial_source:
the study in this process, or the sweep's command over a pipe) until none is left, trains each as an ordinary
run, and tells the source the outcome. Nothing here imports Optuna: a trainer process runs this without it.

A running trial beats a heartbeat. When a worker dies, its trial stops beating
and, GRACE_S later, any worker fails it and queues a copy with the same values
(`retry_of`); Ctrl-C queues the copy at once. A trial that raises (diverges, a
config the sweep's combination makes invalid) is told FAIL with its message in
`error` and is not retried. Re-running the sweep's command opens the same study
and takes what is left.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from mlptrain.config.load import config_from_dict
from mlptrain.errors import TrainingInterrupted, UserError
from mlptrain.run_dirs.lock import release_run
from mlptrain.sweep.report import format_metric, format_params, log_hparams
from mlptrain.sweep.spec import METRICS, Sweep
from mlptrain.sweep.trial_source import COMPLETE, FAIL, PRUNED, Claim, Pruned
from mlptrain.training.experiment import Resources, create_run
from mlptrain.training.loop import training
from mlptrain.packing.auto import resolve
from mlptrain.packing.lane_group import slots
from mlptrain.packing.side_by_side import NoRoom, room_for, side_by_side
from mlptrain.training.steps import finish
from mlptrain.util.background import Waitable
from mlptrain.util.console import console

POLL_S = 0.5  # how often a worker with nothing to take looks again: its command ends this soon after the last trial


def study_source(study, storage, sweep: Sweep, on_trial_end=None):
    """The study in this process as a worker's trial source (mlptrain.sweep.study_trials)."""
    # imported when used: Optuna, which a trainer process never imports
    from mlptrain.sweep.study_trials import StudyTrials

    return StudyTrials(study, storage, sweep, on_trial_end)


def work(study, storage, sweep: Sweep, sweep_dir: Path, resources: Resources, on_trial_end=None,
         wait_for_others: bool = True, stop=None, progress: bool = True) -> None:
    """`work_steps` on the study in this process, run to its end."""
    run_trials(study_source(study, storage, sweep, on_trial_end), sweep, sweep_dir, resources, wait_for_others,
               stop, progress)


def run_trials(source, sweep: Sweep, sweep_dir: Path, resources: Resources, wait_for_others: bool = True, stop=None,
               progress: bool = True) -> None:
    """`work_steps` run to its end."""
    finish(work_steps(source, sweep, sweep_dir, resources, wait_for_others, stop, progress))


def work_steps(source, sweep: Sweep, sweep_dir: Path, resources: Resources, wait_for_others: bool = True, stop=None,
               progress: bool = True, give_way: bool = False):
    """Run the trials `source` (mlptrain.sweep.trial_source) has queued until none is left, then
    (`wait_for_others`) wait for the ones other workers are running: when one of those workers dies, its trial
    is queued again and taken here. A generator: it yields after queueing each optimizer step, so that several
    of them advanced in turn from one thread train their trials side by side (mlptrain.packing.side_by_side;
    such a slot does not wait for others, whose polling would hold up the rest). A worker started by this
    machine's sweep command does not wait: that parent sees its children end and queues a dead one's trial
    again itself (mlptrain.sweep.workers). `stop` (with a `signum`, read after every optimizer step): once set,
    the running trial is queued again and no other is taken (a sweep's trial threads stop this way,
    mlptrain.sweep.threads). `progress`: a progress bar while a trial trains. `give_way`: a trial that does not
    fit in the memory left (OutOfMemory, before it allocates) is queued again and this worker ends, leaving it
    to workers that train fewer trials beside it (a packed worker's second and later slots)."""
    waiting_for = None
    while stop is None or not stop.signum:
        claim = source.claim()
        if claim is not None:
            try:
                yield from _run_trial(source, claim, sweep, sweep_dir, resources, stop, progress, give_way)
            except NoRoom:
                return
            source.trial_ended()
            continue
        if not wait_for_others:
            return
        running = source.running()
        if not running:
            return
        if running != waiting_for:
            console.print(f"waiting for trial(s) {', '.join(map(str, running))}, running in other workers")
            waiting_for = running
        time.sleep(POLL_S)


def work_packed(study, storage, sweep: Sweep, sweep_dir: Path, resources: Resources, pack: int | str,
                on_trial_end=None, stop=None) -> None:
    """`run_packed` on the study in this process."""
    run_packed(lambda: study_source(study, storage, sweep, on_trial_end), sweep, sweep_dir, resources, pack, stop)


def run_packed(new_source, sweep: Sweep, sweep_dir: Path, resources: Resources, pack: int | str, stop=None,
               claim_ahead=None) -> None:
    """`pack` workers side by side in this thread, each taking queued trials (from a source `new_source()`
    makes for it) until none is left: `pack` trials train at once (mlptrain.packing.side_by_side): MLPs in
    lanes of one group, one launch for each kernel of all their steps (mlptrain.packing.lane_group); other
    models with their steps queued in turn, each on a stream of its own (the first on `resources`, the others
    on views of their own on its GPU). `stop` as `work_steps`'s; when one of them fails outside a trial, `stop`
    is set, so that the others queue their trials again, and it is raised. `pack` "auto": as many as
    mlptrain.packing.auto measures for the sweep's base config (at most its trials). `claim_ahead(count)`, where
    given, is told how many slots are about to claim their first trials (a trainer's pipe asks for them at once)."""
    base = config_from_dict(sweep.raw)
    pack = resolve(pack, base, resources, sweep.trials)
    group, views = slots(base, resources, min(pack, sweep.trials))  # lanes no trial would fill cost a lane each
    if claim_ahead is not None:
        claim_ahead(len(views))
    side_by_side([work_steps(new_source(), sweep, sweep_dir, view, wait_for_others=False, stop=stop, progress=False,
                             give_way=i > 0) for i, view in enumerate(views)], stop, group)


@dataclass
class _Attempt:
    params: dict
    config: object = None
    run_dir: Path | None = None
    last: dict = field(default_factory=dict)  # the latest evaluation record


def _run_trial(source, claim: Claim, sweep: Sweep, sweep_dir: Path, resources: Resources, stop=None,
               progress: bool = True, give_way: bool = False) -> None:
    attempt = _Attempt(claim.params)
    # not highlighted (Rich's number colouring took ~1 ms a line on the GPU machine, 16 lanes in turn at a packed
    # sweep's start: benchmarks/NOTES.md, issue 30 step 25); a value's brackets are its own, not markup
    console.print(f"[bold]trial {claim.number}[/]: {escape(format_params(attempt.params))}", highlight=False)
    try:
        yield from _attempt(source, claim, attempt, sweep, sweep_dir, resources, stop, progress, give_way)
    finally:
        if attempt.run_dir is not None:
            release_run(attempt.run_dir)


def _attempt(source, claim: Claim, attempt, sweep: Sweep, sweep_dir: Path, resources, stop, progress: bool,
             give_way: bool = False) -> None:
    with source.beating(claim):
        try:
            summary = yield from _train(source, claim, attempt, sweep, sweep_dir, resources, stop, progress,
                                        give_way)
        except Pruned as pruned:
            console.print(f"trial {claim.number}: {pruned}")
            _tell(source, claim, PRUNED, attempt, attempt.last)
        except KeyboardInterrupt:
            with _signals_held():
                source.requeue(claim)
                _tell(source, claim, FAIL, attempt, attempt.last)
            raise
        except TrainingInterrupted:  # `stop` was set (another thread got the signal): the same, from a thread
            source.requeue(claim)
            _tell(source, claim, FAIL, attempt, attempt.last)
            console.print(f"trial {claim.number}: stopped; queued again")
        except NoRoom as err:
            source.requeue(claim)
            _tell(source, claim, FAIL, attempt, attempt.last)
            console.print(f"[yellow]warning:[/] trial {claim.number} does not fit beside the trials this worker "
                          f"trains already ({err}); queued again, and this worker trains one trial fewer at once",
                          highlight=False)
            raise
        except Exception as err:  # the trial failed, the sweep goes on
            error = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            if not isinstance(err, UserError):
                console.print_exception(max_frames=8)
            console.print(f"[bold red]trial {claim.number} failed:[/] {error}", highlight=False)
            _tell(source, claim, FAIL, attempt, attempt.last, error=error)
        else:
            value = summary[sweep.metric]
            console.print(f"trial {claim.number}: {sweep.metric} {format_metric(value)}", highlight=False)
            # written behind, after the trial's reports: a packed group's lanes end together, and each tell's
            # journal writes (the lock, the write and its fsync, for the metrics and then the outcome) held up
            # the ends of the lanes after it
            told = source.tell(claim, COMPLETE, summary, value)
            yield Waitable(told)
            told.result()


def _train(source, claim: Claim, attempt: _Attempt, sweep: Sweep, sweep_dir: Path, resources: Resources, stop,
           progress: bool, give_way: bool = False) -> dict:
    attempt.config = sweep.trial_config(attempt.params, "its config")
    with resources.allocating(), room_for(give_way):  # refusals before the folder
        session = resources.session(attempt.config)
    attempt.run_dir = create_run(attempt.config, sweep_dir, f"trial-{claim.number:04d}", "trial",
                                 suffix_on_clash=True, dataset=session.dataset, backend=session.backend.name)
    # written behind: nothing waits for them but the outcome, which waits for the trial's records first
    pending = [source.set_run_dir(claim, str(attempt.run_dir))]
    worse = "below" if sweep.direction == "maximize" else "above"
    # what the pruner compared: the median's rule, or the rung of successive halving (Hyperband's brackets)
    rule = f"is {worse} the other trials' median" if sweep.prune in (True, "median") else \
        f"is not among the best at its rung ({str(sweep.prune).replace('_', ' ')})"

    def on_evaluation(record: dict) -> None:
        attempt.last = record
        if sweep.metric not in record:
            return
        if not sweep.prune:  # nothing waits for the report: written behind the training
            pending.append(source.report(claim, record[sweep.metric], record["epoch"]))
            return
        if source.should_prune(claim, record[sweep.metric], record["epoch"]):
            value = format_metric(record[sweep.metric])
            raise Pruned(f"pruned after epoch {record['epoch']}: {sweep.metric} {value} {rule}")

    try:
        # without pruning, on_evaluation never stops the run: a packed lane may finish its epoch's end later
        summary = yield from training(session, attempt.run_dir, on_evaluation, stop=stop, progress=progress,
                                      evaluation_stops=bool(sweep.prune))
    except BaseException:
        for future in pending:  # the study learns of the failure after the records before it
            future.exception()
        raise
    for future in pending:  # a record that failed fails the trial, as it did when written at once
        future.result()
    value = summary.get(sweep.metric)
    if sweep.metric not in summary:
        raise UserError(f"the run reports no {sweep.metric} (its metrics: "
                        f"{', '.join(k for k in METRICS if k in summary)}); choose one of those for the sweep")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"the run's {sweep.metric} is {value!r}; a trial needs a finite value to rank")
    return summary


def _tell(source, claim: Claim, state: str, attempt: _Attempt, metrics: dict, error: str | None = None) -> None:
    """A trial's outcome other than completion, told at once; a pruned or failed run that did not finish logs its
    hyperparameters here (a finished run has logged its own)."""
    told = source.tell(claim, state, metrics, None, error).result()
    outcome = state == PRUNED or error is not None  # not an interrupted attempt, which runs again
    if told and outcome and attempt.run_dir is not None and not (attempt.run_dir / "summary.json").exists():
        log_hparams(attempt.run_dir)


@contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait while an interrupted trial is queued again, so the queue is never left
    half-written."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
