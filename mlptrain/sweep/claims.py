"""Who runs which trial: a worker claims a waiting trial in one transaction, and a running trial is taken
for abandoned only when its worker is known to be gone.

Optuna's own `set_trial_state_values(RUNNING)` reads the trial's state and then writes it; on SQLite the
read is outside the write transaction, so two workers under load can both see WAITING and both "win".
Here the claim is ONE conditional UPDATE (`... SET state = 'RUNNING' WHERE trial_id = ? AND state =
'WAITING'`): SQLite evaluates it under its write lock and PostgreSQL re-checks the condition after
waiting for the row lock, so exactly one worker's UPDATE changes a row, and only that worker runs the
trial. The same transaction records the worker (host, boot id, pid, process start time) as the trial's
system attribute WORKER.

A heartbeat alone cannot tell a dead worker from a busy one: a worker starved of CPU misses its beats
while still training. So a trial whose worker ran on this machine is abandoned only when that process
is gone (no such pid, a zombie, or a pid reused by a process started later); the heartbeat decides only
for workers on other machines. Freeing an abandoned trial is again one conditional UPDATE (RUNNING ->
FAIL), so exactly one worker queues its re-run.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path

from sqlalchemy import DateTime, and_, column, func, insert, literal_column, select, table, type_coerce, update

WORKER = "mlptrain:worker"  # the system attribute naming the process that runs a trial

# The columns of Optuna's RDB schema read or written here (stable since Optuna 2; SQLAlchemy quotes them
# for each database, `key` included)
_trials = table("trials", column("trial_id"), column("study_id"), column("state"), column("datetime_start"),
                column("datetime_complete"))
_attributes = table("trial_system_attributes", column("trial_id"), column("key"), column("value_json"))
_heartbeats = table("trial_heartbeats", column("trial_id"), column("heartbeat"))


def _state(name: str):
    # an untyped SQL literal: PostgreSQL stores the state as its own ENUM type, SQLite as text
    return literal_column(f"'{name}'")


@lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (the state first); raises OSError."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks after boot) from /proc, or None where there is no /proc."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError):
        return None


def this_worker() -> dict:
    """What identifies this process among all workers of a study."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "started": process_start(pid)}


def process_alive(pid: int, started: int | None) -> bool:
    """Whether process `pid` of this machine, started at `started` (ticks after boot), still runs."""
    try:
        fields = _stat_fields(pid)
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            pass
        return True
    if fields[0] in ("Z", "X"):  # exited, not yet reaped by its parent
        return False
    return started is None or int(fields[19]) == started


def on_this_machine(worker: dict) -> bool:
    return worker.get("host") == socket.gethostname() and worker.get("boot") == _boot_id()


def claim(storage, trial_id: int, worker: dict) -> bool:
    """Move trial `trial_id` from WAITING to RUNNING for `worker`; False when another worker did first."""
    with storage.engine.begin() as conn:
        moved = conn.execute(update(_trials).where(and_(_trials.c.trial_id == trial_id, _trials.c.state == _state("WAITING")))
                             .values(state=_state("RUNNING"), datetime_start=datetime.now())).rowcount
        if moved != 1:
            return False
        conn.execute(insert(_attributes).values(trial_id=trial_id, key=WORKER, value_json=json.dumps(worker)))
    return True


def release(storage, trial_id: int) -> bool:
    """Mark a running trial FAIL; False when it had already finished (or another worker released it)."""
    with storage.engine.begin() as conn:
        return conn.execute(update(_trials).where(and_(_trials.c.trial_id == trial_id, _trials.c.state == _state("RUNNING")))
                            .values(state=_state("FAIL"), datetime_complete=datetime.now())).rowcount == 1


def abandoned(storage, study_id: int, grace_s: float) -> list[int]:
    """The running trials of the study whose worker is gone: dead on this machine, or silent for grace_s
    on another one (or, with no worker recorded, by the heartbeat alone)."""
    joined = _trials.outerjoin(_heartbeats, _heartbeats.c.trial_id == _trials.c.trial_id).outerjoin(
        _attributes, and_(_attributes.c.trial_id == _trials.c.trial_id, _attributes.c.key == WORKER))
    query = select(_trials.c.trial_id, type_coerce(_heartbeats.c.heartbeat, DateTime), _attributes.c.value_json,
                   type_coerce(func.now(), DateTime)).select_from(joined).where(
        and_(_trials.c.study_id == study_id, _trials.c.state == _state("RUNNING")))
    with storage.engine.connect() as conn:
        rows = conn.execute(query).all()
    gone = []
    for trial_id, heartbeat, value_json, now in rows:
        worker = json.loads(value_json) if value_json else None
        if worker is not None and on_this_machine(worker):
            if not process_alive(worker["pid"], worker.get("started")):
                gone.append(trial_id)
        elif heartbeat is not None and _naive(now) - _naive(heartbeat) > timedelta(seconds=grace_s):
            gone.append(trial_id)
    return gone


def _naive(moment: datetime) -> datetime:
    # PostgreSQL's CURRENT_TIMESTAMP carries a time zone, the stored heartbeat none (as Optuna does)
    return moment.replace(tzinfo=None)
