"""A sweep's study: its storage (a journal file in the sweep's folder by default, or any database URL Optuna
takes), created once with every trial the sweep will run queued, or opened again and checked to be the same
sweep.

Every trial a sweep will run is created once, when its study is: a grid queues
each point of its product, random and tpe queue `trials` empty slots whose
values the sampler picks when a worker takes one. (Optuna's GridSampler on its
own may repeat a point under several workers, so it only names the grid.) How
workers take and run the queued trials is mlptrain.sweep.engine.

The default storage is Optuna's journal file (`study.journal`): each change is a line appended under a lock
file, and opening it is reading it. A database (SQLite, PostgreSQL) needs SQLAlchemy, which takes half a second
to import, and a new SQLite study its tables: together about a second before a sweep's first trial, paid only
when `--storage` names a database (mlptrain.sweep.database) or a sweep's folder holds the `study.db` of an
earlier version.
"""

from __future__ import annotations

import fcntl
import time
from contextlib import contextmanager
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from mlptrain.config.safe_yaml import brief
from mlptrain.errors import UserError
from mlptrain.sweep.spec import Sweep
from mlptrain.sweep.storage import described, is_database
from mlptrain.util.regular_file import open_regular

SETUP_WAIT_S = 60  # how long to wait for another worker to finish queueing a new study's trials
PRUNE_AFTER_TRIALS = 5  # Optuna's default: the median of fewer finished trials is noise
READY_POLL_S = 0.005  # how often a `--worker` child looks for READY: its first trial waits up to this long
READY = ".study-ready"  # in the sweep folder once its study exists: `--worker` children wait for it

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _journal(location: str):
    """Optuna's journal storage in file `location` (made when missing); the lock is a link beside it, which
    also holds on NFS, so machines may share the file."""
    try:
        return JournalStorage(JournalFileBackend(location))
    except OSError as err:
        raise UserError(f"--storage {location}: cannot open the journal file ({err.strerror or err})") from None
    except Exception as err:  # a file that is not a journal
        raise UserError(f"--storage {location}: not an Optuna journal file ({type(err).__name__}: {err}); an "
                        f"SQLite study is named by its URL, sqlite:///{location}") from None


class _QueuedGridSampler(optuna.samplers.GridSampler):
    """Every point comes from the queue with fixed values, so the sampler never picks one. Its
    after_trial only stops `study.optimize`, which sweeps do not use, and needs a `grid_id` that
    queued trials lack."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def _sampler(sweep: Sweep):
    if sweep.method == "grid":
        return _QueuedGridSampler({p.name: p.stored for p in sweep.parameters})
    if sweep.method == "random":
        return optuna.samplers.RandomSampler()
    return optuna.samplers.TPESampler(constant_liar=True)  # several workers: running trials count as bad


def _pruner(prune):
    """Optuna's pruner for a sweep file's `prune:` (false; true is the median's). Each reads the metric a
    trial reports after every evaluation (its epoch is the step): the median pruner stops a trial below the
    median of the others at the same epoch (after PRUNE_AFTER_TRIALS trials), successive halving keeps the
    best quarter at each rung of epochs, and Hyperband runs several successive-halving brackets."""
    if not prune:
        return optuna.pruners.NopPruner()
    if prune is True or prune == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=PRUNE_AFTER_TRIALS)
    if prune == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.HyperbandPruner()


def _open(location: str, made: bool):
    """The storage at `location`. `made`: the sweep's own command has made (or checked) it already."""
    if not is_database(location):
        return _journal(location)
    # SQLAlchemy only for a database study: it takes half a second to import
    from mlptrain.sweep import database

    storage = database.open_database(location, checked=True) if made else database.new_database(location)
    if not made:
        database.write_ahead_log(storage)
    database.sync_at_checkpoints(storage)
    return storage


def close_storage(storage) -> None:
    """Close a database study's connections once this process is done with it: SQLite then moves its
    write-ahead log into the file and syncs it, as the interpreter's teardown did when it closed them (the
    command now ends before that: mlptrain.__main__). A journal keeps nothing open."""
    engine = getattr(storage, "engine", None)
    if engine is not None:
        engine.dispose()


@contextmanager
def _setup_lock(folder: Path):
    """Serialises set-up among this machine's workers (the SQLite schema is created on first open)."""
    path = folder / ".setup.lock"
    try:  # never truncated, nor opened through a link put in its place (mlptrain.run_dirs.links)
        lock = open_regular(path, "r+b", follow=False)
    except OSError as err:
        raise UserError(f"{path}: cannot open it ({err.strerror or err}); remove it (a sweep makes it again)") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def open_study(sweep: Sweep, sweep_dir: Path, name: str, url: str, worker: bool = False):
    """(study, storage): the study `name`, created with its whole queue, or the one that exists,
    which must be this same sweep. `worker`: a `--worker` child of this machine's sweep command, which
    opens the study (it waits for that) and checks it: the child loads it without the set-up lock and
    schema checks."""
    pruner = _pruner(sweep.prune)
    if worker:
        _wait_for_study(sweep_dir, url)
        storage = _open(url, made=True)
        study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(sweep), pruner=pruner)
        _check_same_sweep(study, sweep, sweep_dir, url)
        return study, storage
    with _setup_lock(sweep_dir):
        storage = _open(url, made=False)
        try:
            study = optuna.create_study(storage=storage, study_name=name, sampler=_sampler(sweep), pruner=pruner,
                                        direction=sweep.direction)
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(sweep), pruner=pruner)
            _check_same_sweep(study, sweep, sweep_dir, url)
        else:
            for params in sweep.grid() if sweep.method == "grid" else [{}] * sweep.trials:
                study.enqueue_trial(params)
            study.set_user_attr("sweep", sweep.definition())  # last: tells other workers the queue is complete
        (sweep_dir / READY).touch()
    return study, storage


def _wait_for_study(sweep_dir: Path, url: str) -> None:
    """A `--worker` child starts before its parent has opened the study (so that its own start overlaps
    the parent's): it waits until the study exists."""
    deadline = time.monotonic() + SETUP_WAIT_S
    while not (sweep_dir / READY).exists():
        if time.monotonic() > deadline:
            raise UserError(f"{described(url)}: the sweep command that started this worker never opened its study")
        time.sleep(READY_POLL_S)


def _check_same_sweep(study, sweep: Sweep, sweep_dir: Path, url: str) -> None:
    deadline = time.monotonic() + SETUP_WAIT_S
    while "sweep" not in study.user_attrs:
        if time.monotonic() > deadline:
            raise UserError(f"study '{study.study_name}' in {described(url)} was created but its trials were never "
                            "queued (its creator stopped); delete it (optuna delete-study) or choose another --name")
        time.sleep(0.5)
    stored, wanted = study.user_attrs["sweep"], sweep.definition()
    changed = [key for key in wanted if stored.get(key) != wanted[key]]
    if changed:
        raise UserError(f"{sweep_dir}: this sweep was started with a different {', '.join(changed)} "
                        f"({_differences(stored, wanted, changed)}); re-run it unchanged to continue it, or choose "
                        "another --name")


def _differences(stored: dict, wanted: dict, changed: list[str], shown: int = 3) -> str:
    """What differs, by dotted key (`base.optim.lr: 0.001 then, 0.01 now`), the first `shown` of them."""
    def flat(value, prefix):
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}.{key}").items()}
        return {prefix: value}

    then = {k: v for key in changed for k, v in flat(stored.get(key), key).items()}
    now = {k: v for key in changed for k, v in flat(wanted.get(key), key).items()}
    keys = sorted(key for key in {*then, *now} if then.get(key, _ABSENT) != now.get(key, _ABSENT))
    def shown_value(values, key):
        return brief(values[key]) if key in values else "unset"

    parts = [f"{key}: {shown_value(then, key)} then, {shown_value(now, key)} now" for key in keys[:shown]]
    return "; ".join(parts) + (f"; and {len(keys) - shown} more" if len(keys) > shown else "")


_ABSENT = object()
