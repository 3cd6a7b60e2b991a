"""The study as a sweep's worker uses it (mlptrain.sweep.trial_source): Optuna's trials claimed, reported and
told in this process, for the worker threads of this process or, over a pipe, for a trainer process that
never imports Optuna (mlptrain.sweep.trainer_pipe).

Workers (threads of the sweep's process, child processes, or other machines sharing the storage) only ever
take queued trials, and the storage moves a trial from WAITING to RUNNING atomically (mlptrain.sweep.claims),
so no trial runs twice and nothing beyond the plan runs. A trial whose worker died is failed and queued again
with the same values (`retry_of`) by whichever worker sees it first (`requeue_stale`).
"""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import contextmanager

import optuna
from optuna.trial import TrialState

from mlptrain.sweep import claims
from mlptrain.sweep.heartbeats import HEARTBEATS
from mlptrain.sweep.liveness import GRACE_S
from mlptrain.sweep.spec import METRICS, Sweep
from mlptrain.sweep.trial_source import COMPLETE, FAIL, PRUNED, Claim
from mlptrain.util.background import pool
from mlptrain.util.console import console

STATES = {COMPLETE: TrialState.COMPLETE, PRUNED: TrialState.PRUNED, FAIL: TrialState.FAIL}


def requeue_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
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
            requeue_trial(study, frozen)
            queued += 1
    return queued


class StudyTrials:
    """A worker's trial source (mlptrain.sweep.trial_source) on `study` in this process. The reports, the run
    folders' records and the outcomes are written on one background thread of the process, in the order asked
    (each a journal append, ~2.6 ms on the GPU machine: the lanes of a packed sweep paid them in turn at every
    epoch's end while the GPU idled); the command serving a trainer process waits for each in turn
    (mlptrain.sweep.trainer_pipe.serve).
    `on_trial_end()` runs after each trial with an outcome."""

    def __init__(self, study, storage, sweep: Sweep, on_trial_end=None):
        self.study, self.storage, self.sweep = study, storage, sweep
        self.on_trial_end = on_trial_end
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.trials: dict[int, optuna.trial.Trial] = {}  # by trial id, while claimed here
        self.claimed = 0  # how many trials this source has handed out

    def claim(self) -> Claim | None:
        requeue_stale(self.study, self.storage, self.study_id)
        claimed = claim_next(self.study, self.storage, self.study_id)
        if claimed is None:
            return None
        trial, trial_id = claimed
        self.trials[trial_id] = trial
        self.claimed += 1
        return Claim(trial.number, trial_id, self.sweep.suggest(trial))

    def running(self) -> list[int]:
        return [t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]

    @contextmanager
    def beating(self, claim: Claim):
        with HEARTBEATS.beating(self.storage, claim.trial_id):
            yield

    def _behind(self, work, *args) -> Future:
        return pool("reports", 1).submit(work, *args)

    def set_run_dir(self, claim: Claim, run_dir: str) -> Future:
        return self._behind(self.trials[claim.trial_id].set_user_attr, "run_dir", run_dir)

    def report(self, claim: Claim, value: float, epoch: int) -> Future:
        return self._behind(self.trials[claim.trial_id].report, value, epoch)

    def should_prune(self, claim: Claim, value: float, epoch: int) -> bool:
        trial = self.trials[claim.trial_id]
        trial.report(value, epoch)
        return trial.should_prune()

    def requeue(self, claim: Claim) -> None:
        requeue_trial(self.study, self.storage.get_trial(claim.trial_id))

    def tell(self, claim: Claim, state: str, metrics: dict, value=None, error: str | None = None) -> Future:
        return self._behind(self._tell, claim, state, metrics, value, error)

    def _tell(self, claim: Claim, state: str, metrics: dict, value, error: str | None) -> bool:
        trial = self.trials.pop(claim.trial_id)
        kept = {k: metrics[k] for k in METRICS if isinstance(metrics.get(k), (int, float))}
        try:
            trial.set_user_attr("metrics", kept)
            if error is not None:
                trial.set_user_attr("error", error)
            self.study.tell(trial, value, state=STATES[state])
        except optuna.exceptions.UpdateFinishedTrialError:
            console.print(f"trial {claim.number}: another worker took it over (its heartbeat lapsed); its result "
                          "here is dropped")
            return False
        return True

    def trial_ended(self) -> None:
        if self.on_trial_end is not None:
            self.on_trial_end()
