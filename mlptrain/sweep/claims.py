"""Who runs which trial: a worker claims a waiting trial so that no other worker can, and a running trial is
taken for abandoned only when its worker is known to be gone (mlptrain.sweep.liveness).

A study lives in a journal file (Optuna's JournalStorage, a sweep's default) or in a database
(mlptrain.sweep.sql_claims, imported only then). In a journal every change is a line appended under the
file's lock and applied in the file's order by every reader: of two workers that append RUNNING for the
same trial, the trial is the first one's, the second's line is ignored, and Optuna tells each which it was.
The worker is then recorded as the trial's system attribute WORKER, and its heartbeats as HEARTBEAT: a
process that dies between the claim and that record leaves a trial whose start is its last sign of life.
"""

from __future__ import annotations

from datetime import datetime, timezone

from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import JournalStorage
from optuna.trial import TrialState

from mlptrain.sweep.liveness import WORKER, gone, process_alive, process_start, this_worker

__all__ = ["WORKER", "HEARTBEAT", "claim", "release", "abandoned", "beat", "process_alive", "process_start",
           "this_worker"]

HEARTBEAT = "mlptrain:heartbeat"  # in a journal: the trial's latest heartbeat (UTC, ISO 8601)


def _database(storage):
    """The SQL claims of a database study, or None for a journal: SQLAlchemy is imported only when used."""
    if isinstance(storage, JournalStorage):
        return None
    # SQLAlchemy only for a database study: it takes half a second to import
    from mlptrain.sweep import sql_claims

    return sql_claims


def claim(storage, trial_id: int, worker: dict) -> bool:
    """Move trial `trial_id` from WAITING to RUNNING for `worker`; False when another worker did first."""
    database = _database(storage)
    if database is not None:
        return database.claim(storage, trial_id, worker)
    try:
        if not storage.set_trial_state_values(trial_id, TrialState.RUNNING):
            return False
    except UpdateFinishedTrialError:
        return False
    storage.set_trial_system_attr(trial_id, WORKER, worker)
    return True


def release(storage, trial_id: int) -> bool:
    """Mark a running trial FAIL; False when it had already finished (or another worker released it)."""
    database = _database(storage)
    if database is not None:
        return database.release(storage, trial_id)
    try:
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False
    return True


def abandoned(storage, study_id: int, grace_s: float) -> list[int]:
    """The running trials of the study whose worker is gone: dead on this machine, or silent for grace_s
    on another one (or, with no worker recorded, by the heartbeat alone)."""
    database = _database(storage)
    if database is not None:
        return database.abandoned(storage, study_id, grace_s)
    now, found = datetime.now(timezone.utc), []
    for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        beat_at = trial.system_attrs.get(HEARTBEAT)
        # Optuna keeps the start as local time without a zone
        last = datetime.fromisoformat(beat_at) if beat_at else trial.datetime_start.astimezone(timezone.utc)
        if gone(trial.system_attrs.get(WORKER), last, now, grace_s):
            found.append(storage.get_trial_id_from_study_id_trial_number(study_id, trial.number))
    return found


def beat(storage, trial_id: int) -> None:
    """Record that the trial's worker is alive."""
    database = _database(storage)
    if database is not None:
        database.beat(storage, trial_id)
        return
    try:
        storage.set_trial_system_attr(trial_id, HEARTBEAT, datetime.now(timezone.utc).isoformat())
    except UpdateFinishedTrialError:  # the trial was told its outcome as this beat came due: nothing to say
        pass
