"""How a sweep's workers run its trials: each takes queued trials from the study (mlptrain.sweep.study) until
none is left, trains each as an ordinary run, and tells the study the outcome.

Workers (threads of the sweep's process, child processes, or other machines sharing the storage) only ever
take queued trials, and the storage moves a trial from WAITING to RUNNING atomically (mlptrain.sweep.claims),
so no trial runs twice and nothing beyond the plan runs.

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

import optuna
from optuna.trial import TrialState
from rich.markup import escape

from mlptrain.config.load import config_from_dict
from mlptrain.errors import TrainingInterrupted, UserError
from mlptrain.run_dirs.lock import release_run
from mlptrain.sweep import claims
from mlptrain.sweep.heartbeats import HEARTBEATS
from mlptrain.sweep.liveness import GRACE_S
from mlptrain.sweep.report import format_metric, format_params, log_hparams
from mlptrain.sweep.reports import Reports
from mlptrain.sweep.spec import METRICS, Sweep
from mlptrain.training.experiment import Resources, create_run
from mlptrain.training.loop import training
from mlptrain.packing.auto import resolve
from mlptrain.packing.lane_group import slots
from mlptrain.packing.side_by_side import NoRoom, room_for, side_by_side
from mlptrain.training.steps import finish
from mlptrain.util.background import Waitable, pool
from mlptrain.util.console import console

POLL_S = 0.5  # how often a worker with nothing to take looks again: its command ends this soon after the last trial


def _requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue a trial that stopped without an outcome (its worker died or was interrupted) to run again,
    with the values it had, as a new trial marked `retry_of`."""
    if any(t.user_attrs.get("retry_of") == trial.number for t in study.get_trials(deepcopy=False)):
        return
    params = {**trial.system_attrs.get("fixed_params", {}), **trial.params}
    study.enqueue_trial(params, user_attrs={"retry_of": trial.number})


def claim_next(study, storage, study_id: int):
    """(trial, trial_id) of a queued trial this worker now runs, or None when the queue is empty. The claim
    is one transaction (mlptrain.sweep.claims), so no other worker takes the same trial."""
    worker = claims.this_worker()
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        if claims.claim(storage, trial_id, worker):
            return optuna.trial.Trial(study, trial_id), trial_id
    return None


def requeue_stale(study, storage, study_id: int) -> int:
    """Fail the running trials whose worker is gone (claims.abandoned) and queue each again; of several
    workers doing this at once, only the one whose release succeeds queues the re-run. Returns how many
    this call queued again."""
    queued = 0
    for trial_id in claims.abandoned(storage, study_id, GRACE_S):
        if claims.release(storage, trial_id):
            frozen = storage.get_trial(trial_id)
            console.print(f"trial {frozen.number}: its worker is gone; queued again")
            _requeue(study, frozen)
            queued += 1
    return queued


def work(study, storage, sweep: Sweep, sweep_dir: Path, resources: Resources, on_trial_end=None,
         wait_for_others: bool = True, stop=None, progress: bool = True) -> None:
    """`work_steps` run to its end."""
    finish(work_steps(study, storage, sweep, sweep_dir, resources, on_trial_end, wait_for_others, stop, progress))


def work_steps(study, storage, sweep: Sweep, sweep_dir: Path, resources: Resources, on_trial_end=None,
               wait_for_others: bool = True, stop=None, progress: bool = True, give_way: bool = False):
    """Run queued trials until none is left, then (`wait_for_others`) wait for the ones other workers are
    running: when one of those workers dies, its trial is queued again and taken here. A generator: it yields
    after queueing each optimizer step, so that several of them advanced in turn from one thread train their
    trials side by side (mlptrain.packing.side_by_side; such a slot does not wait for others, whose polling would
    hold up the rest). A worker started by this machine's sweep command does not wait: that parent sees its
    children end and queues a dead one's trial again itself (mlptrain.sweep.workers). `stop` (with a `signum`, read after every optimizer step):
    once set, the running trial is queued again and no other is taken (a sweep's trial threads stop this
    way, mlptrain.sweep.threads). `progress`: a progress bar while a trial trains. `give_way`: a trial that
    does not fit in the memory left (OutOfMemory, before it allocates) is queued again and this worker ends,
    leaving it to workers that train fewer trials beside it (a packed worker's second and later slots)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    waiting_for = None
    while stop is None or not stop.signum:
        requeue_stale(study, storage, study_id)
        claimed = claim_next(study, storage, study_id)
        if claimed is not None:
            try:
                yield from _run_trial(study, storage, *claimed, sweep, sweep_dir, resources, stop, progress, give_way)
            except NoRoom:
                return
            if on_trial_end is not None:
                on_trial_end()
            continue
        if not wait_for_others:
            return
        running = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        if not running:
            return
        if running != waiting_for:
            console.print(f"waiting for trial(s) {', '.join(map(str, running))}, running in other workers")
            waiting_for = running
        time.sleep(POLL_S)


def work_packed(study, storage, sweep: Sweep, sweep_dir: Path, resources: Resources, pack: int | str,
                on_trial_end=None, stop=None) -> None:
    """`pack` workers side by side in this thread, each taking queued trials until none is left: `pack` trials
    train at once (mlptrain.packing.side_by_side): MLPs in lanes of one group, one launch for each kernel of all
    their steps (mlptrain.packing.lane_group); other models with their steps queued in turn, each on a stream
    of its own (the first on `resources`, the others on views of their own on its GPU). `stop` as `work`'s;
    when one of them fails outside a trial, `stop` is set, so that the others queue their trials again, and it
    is raised. `pack` "auto": as many as mlptrain.packing.auto measures for the sweep's base config (at most
    its trials)."""
    base = config_from_dict(sweep.raw)
    pack = resolve(pack, base, resources, sweep.trials)
    group, views = slots(base, resources, min(pack, sweep.trials))  # lanes no trial would fill cost a lane each
    side_by_side([work_steps(study, storage, sweep, sweep_dir, view, on_trial_end, wait_for_others=False, stop=stop,
                             progress=False, give_way=i > 0) for i, view in enumerate(views)], stop, group)


@dataclass
class _Attempt:
    params: dict
    config: object = None
    run_dir: Path | None = None
    last: dict = field(default_factory=dict)  # the latest evaluation record


def _run_trial(study, storage, trial, trial_id: int, sweep: Sweep, sweep_dir: Path, resources: Resources,
               stop=None, progress: bool = True, give_way: bool = False) -> None:
    attempt = _Attempt(sweep.suggest(trial))
    # not highlighted (Rich's number colouring took ~1 ms a line on the GPU machine, 16 lanes in turn at a packed
    # sweep's start: benchmarks/NOTES.md, issue 30 step 25); a value's brackets are its own, not markup
    console.print(f"[bold]trial {trial.number}[/]: {escape(format_params(attempt.params))}", highlight=False)
    try:
        yield from _attempt(study, storage, trial, trial_id, attempt, sweep, sweep_dir, resources, stop, progress,
                            give_way)
    finally:
        if attempt.run_dir is not None:
            release_run(attempt.run_dir)


def _attempt(study, storage, trial, trial_id: int, attempt, sweep: Sweep, sweep_dir: Path, resources, stop,
             progress: bool, give_way: bool = False) -> None:
    with HEARTBEATS.beating(storage, trial_id):
        try:
            summary = yield from _train(trial, attempt, sweep, sweep_dir, resources, stop, progress, give_way)
        except optuna.TrialPruned as pruned:
            console.print(f"trial {trial.number}: {pruned}")
            _tell(study, trial, TrialState.PRUNED, attempt, attempt.last)
        except KeyboardInterrupt:
            with _signals_held():
                _requeue(study, storage.get_trial(trial_id))
                _tell(study, trial, TrialState.FAIL, attempt, attempt.last)
            raise
        except TrainingInterrupted:  # `stop` was set (another thread got the signal): the same, from a thread
            _requeue(study, storage.get_trial(trial_id))
            _tell(study, trial, TrialState.FAIL, attempt, attempt.last)
            console.print(f"trial {trial.number}: stopped; queued again")
        except NoRoom as err:
            _requeue(study, storage.get_trial(trial_id))
            _tell(study, trial, TrialState.FAIL, attempt, attempt.last)
            console.print(f"[yellow]warning:[/] trial {trial.number} does not fit beside the trials this worker "
                          f"trains already ({err}); queued again, and this worker trains one trial fewer at once",
                          highlight=False)
            raise
        except Exception as err:  # the trial failed, the sweep goes on
            error = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            if not isinstance(err, UserError):
                console.print_exception(max_frames=8)
            console.print(f"[bold red]trial {trial.number} failed:[/] {error}", highlight=False)
            _tell(study, trial, TrialState.FAIL, attempt, attempt.last, error=error)
        else:
            value = summary[sweep.metric]
            console.print(f"trial {trial.number}: {sweep.metric} {format_metric(value)}", highlight=False)
            # on the reports' thread, after the trial's reports: a packed group's lanes end together, and each
            # tell's journal writes (the lock, the write and its fsync, for the metrics and then the outcome)
            # held up the ends of the lanes after it
            told = pool("reports", 1).submit(_tell, study, trial, TrialState.COMPLETE, attempt, summary, value)
            yield Waitable(told)
            told.result()


def _train(trial, attempt: _Attempt, sweep: Sweep, sweep_dir: Path, resources: Resources, stop,
           progress: bool, give_way: bool = False) -> dict:
    attempt.config = sweep.trial_config(attempt.params, "its config")
    with resources.allocating(), room_for(give_way):  # refusals before the folder
        session = resources.session(attempt.config)
    attempt.run_dir = create_run(attempt.config, sweep_dir, f"trial-{trial.number:04d}", "trial",
                                 suffix_on_clash=True, dataset=session.dataset, backend=session.backend.name)
    trial.set_user_attr("run_dir", str(attempt.run_dir))
    worse = "below" if sweep.direction == "maximize" else "above"
    # what the pruner compared: the median's rule, or the rung of successive halving (Hyperband's brackets)
    rule = f"is {worse} the other trials' median" if sweep.prune in (True, "median") else \
        f"is not among the best at its rung ({str(sweep.prune).replace('_', ' ')})"

    reports = Reports(trial)

    def on_evaluation(record: dict) -> None:
        attempt.last = record
        if sweep.metric not in record:
            return
        if not sweep.prune:  # nothing waits for the report: written behind the training
            reports.add(record[sweep.metric], record["epoch"])
            return
        trial.report(record[sweep.metric], record["epoch"])
        if trial.should_prune():
            value = format_metric(record[sweep.metric])
            raise optuna.TrialPruned(f"pruned after epoch {record['epoch']}: {sweep.metric} {value} {rule}")

    try:
        # without pruning, on_evaluation never stops the run: a packed lane may finish its epoch's end later
        summary = yield from training(session, attempt.run_dir, on_evaluation, stop=stop, progress=progress,
                                      evaluation_stops=bool(sweep.prune))
    except BaseException:
        reports.settle()  # the study learns of the failure after the reports before it
        raise
    reports.wait()  # a report that failed fails the trial, as it did when written at once
    value = summary.get(sweep.metric)
    if sweep.metric not in summary:
        raise UserError(f"the run reports no {sweep.metric} (its metrics: "
                        f"{', '.join(k for k in METRICS if k in summary)}); choose one of those for the sweep")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"the run's {sweep.metric} is {value!r}; a trial needs a finite value to rank")
    return summary


def _tell(study, trial, state, attempt: _Attempt, metrics: dict, value=None, error: str | None = None) -> None:
    kept = {k: metrics[k] for k in METRICS if isinstance(metrics.get(k), (int, float))}
    try:
        trial.set_user_attr("metrics", kept)
        if error is not None:
            trial.set_user_attr("error", error)
        study.tell(trial, value, state=state)
    except optuna.exceptions.UpdateFinishedTrialError:
        console.print(f"trial {trial.number}: another worker took it over (its heartbeat lapsed); its result "
                      "here is dropped")
        return
    outcome = state == TrialState.PRUNED or error is not None  # not an interrupted attempt, which runs again
    if outcome and attempt.run_dir is not None and not (attempt.run_dir / "summary.json").exists():
        log_hparams(attempt.run_dir)  # a finished run has logged its own


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
