"""Claims in a database study (mlptrain.sweep.claims): each is ONE conditional UPDATE.

Optuna's own `set_trial_state_values(RUNNING)` reads the trial's state and then writes it; on SQLite the
read is outside the write transaction, so two workers under load can both see WAITING and both "win".
Here the claim is `... SET state = 'RUNNING' WHERE trial_id = ? AND state = 'WAITING'`: SQLite evaluates it
under its write lock and PostgreSQL re-checks the condition after waiting for the row lock, so exactly one
worker's UPDATE changes a row, and only that worker runs the trial. The same transaction records the worker
as the trial's system attribute WORKER. Freeing an abandoned trial is again one conditional UPDATE
(RUNNING -> FAIL), so exactly one worker queues its re-run.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import DateTime, and_, column, func, insert, literal_column, select, table, type_coerce, update

from mlptrain.sweep.liveness import WORKER, gone

# The columns of Optuna's RDB schema read or written here (stable since Optuna 2; SQLAlchemy quotes them
# for each database, `key` included)
_trials = table("trials", column("trial_id"), column("study_id"), column("state"), column("datetime_start"),
                column("datetime_complete"))
_attributes = table("trial_system_attributes", column("trial_id"), column("key"), column("value_json"))
_heartbeats = table("trial_heartbeats", column("trial_id"), column("heartbeat"))


def _state(name: str):
    # an untyped SQL literal: PostgreSQL stores the state as its own ENUM type, SQLite as text
    return literal_column(f"'{name}'")


def claim(storage, trial_id: int, worker: dict) -> bool:
    storage.record_heartbeat(trial_id)  # before the claim, so that no claimed trial lacks a heartbeat
    with storage.engine.begin() as conn:
        moved = conn.execute(update(_trials).where(and_(_trials.c.trial_id == trial_id, _trials.c.state == _state("WAITING")))
                             .values(state=_state("RUNNING"), datetime_start=datetime.now())).rowcount
        if moved != 1:
            return False
        conn.execute(insert(_attributes).values(trial_id=trial_id, key=WORKER, value_json=json.dumps(worker)))
    return True


def release(storage, trial_id: int) -> bool:
    with storage.engine.begin() as conn:
        return conn.execute(update(_trials).where(and_(_trials.c.trial_id == trial_id, _trials.c.state == _state("RUNNING")))
                            .values(state=_state("FAIL"), datetime_complete=datetime.now())).rowcount == 1


def abandoned(storage, study_id: int, grace_s: float) -> list[int]:
    joined = _trials.outerjoin(_heartbeats, _heartbeats.c.trial_id == _trials.c.trial_id).outerjoin(
        _attributes, and_(_attributes.c.trial_id == _trials.c.trial_id, _attributes.c.key == WORKER))
    query = select(_trials.c.trial_id, type_coerce(_heartbeats.c.heartbeat, DateTime), _attributes.c.value_json,
                   type_coerce(func.now(), DateTime)).select_from(joined).where(
        and_(_trials.c.study_id == study_id, _trials.c.state == _state("RUNNING")))
    with storage.engine.connect() as conn:
        rows = conn.execute(query).all()
    # the database's own clock for both (PostgreSQL's CURRENT_TIMESTAMP carries a time zone, the stored
    # heartbeat none, as Optuna writes it)
    return [trial_id for trial_id, heartbeat, value_json, now in rows
            if gone(json.loads(value_json) if value_json else None, heartbeat and heartbeat.replace(tzinfo=None),
                    now.replace(tzinfo=None), grace_s)]


def beat(storage, trial_id: int) -> None:
    storage.record_heartbeat(trial_id)
