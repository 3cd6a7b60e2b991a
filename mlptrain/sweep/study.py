"""A sweep's study: its storage (SQLite in the sweep's folder by default, or any database URL Optuna takes),
created once with every trial the sweep will run queued, or opened again and checked to be the same sweep.

Every trial a sweep will run is created once, when its study is: a grid queues
each point of its product, random and tpe queue `trials` empty slots whose
values the sampler picks when a worker takes one. (Optuna's GridSampler on its
own may repeat a point under several workers, so it only names the grid.) How
workers take and run the queued trials is mlptrain.sweep.engine.
"""

from __future__ import annotations

import fcntl
import shutil
import time
import warnings
from contextlib import contextmanager, suppress
from importlib.util import find_spec
from pathlib import Path

import optuna
import sqlalchemy
from sqlalchemy import event

from mlptrain.config.safe_yaml import brief
from mlptrain.errors import UserError
from mlptrain.sweep.spec import Sweep
from mlptrain.util.atomic import replacing
from mlptrain.util.user_paths import cache_folder

HEARTBEAT_S = 10  # how often a running trial says it is alive
GRACE_S = 30  # silence after which its worker is taken for dead and the trial is queued again
SETUP_WAIT_S = 60  # how long to wait for another worker to finish queueing a new study's trials
PRUNE_AFTER_TRIALS = 5  # Optuna's default: the median of fewer finished trials is noise
STUDY_CACHE_ENV = "MLPTRAIN_STUDY_CACHE"  # where the empty study file is kept (see _new_storage)
READY = ".study-ready"  # in the sweep folder once its study exists: `--worker` children wait for it

optuna.logging.set_verbosity(optuna.logging.WARNING)


@contextmanager
def _quiet():
    """Heartbeats are marked experimental in Optuna; the warning would print on every run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


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


def database_url(url: str) -> str:
    """`url` with a PostgreSQL driver named when it names none: SQLAlchemy 2.1's default for postgresql://
    is psycopg 3, so psycopg2 alone would fail; whichever is installed is used, psycopg first."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    rest = url.split("://", 1)[1]
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise UserError(f"--storage {_redacted(url)}: no PostgreSQL driver is installed; pip install 'mlptrain[postgres]' "
                    "(psycopg 3), or psycopg2 and write postgresql+psycopg2://")


def _storage(url: str, checked: bool = False):
    """Optuna's RDB storage at `url`. `checked`: the sweep's own command has just made (or checked) the
    tables, so their creation and the schema's version check are skipped."""
    url = database_url(url)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}  # workers wait their turn
    try:
        with _quiet():
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, skip_compatibility_check=checked,
                                              skip_table_creation=checked)
    except Exception as err:  # a bad URL, a missing driver, an unreachable server: one line
        raise UserError(f"--storage {_redacted(url)}: cannot open it ({type(err).__name__}: {err})") from None


def _new_storage(url: str):
    """The storage of a new study at `url`. A new SQLite file starts as a copy of an empty one made before by
    this Optuna and SQLAlchemy (kept in $MLPTRAIN_STUDY_CACHE, else the user cache folder's
    mlptrain/studies; `off` turns it off), so that its tables and Alembic's stamp are not made again:
    Optuna reads its ~30 migration scripts for that, about a third of a second before the first trial. The
    first new file on a machine is made by Optuna and copied there."""
    database = sqlite_file(url)
    template = _study_template()
    if database is None or template is None or database.exists():
        return _storage(url)
    try:
        with open(template, "rb") as source, open(database, "xb") as target:  # never over another's file
            shutil.copyfileobj(source, target)
        return _storage(url, checked=True)
    except FileExistsError:  # another command made it meanwhile: it is opened as it is
        return _storage(url)
    except FileNotFoundError:  # no copy yet: Optuna makes the file, and it is copied for the next study
        pass
    except (OSError, UserError):  # an unreadable or damaged copy: Optuna makes the file afresh
        database.unlink(missing_ok=True)
    storage = _storage(url)
    with suppress(OSError):  # a cache that cannot be written only costs the next study the same time
        template.parent.mkdir(parents=True, exist_ok=True)
        with replacing(template, durable=False) as copy, open(database, "rb") as made:
            shutil.copyfileobj(made, copy)  # before WAL mode: every table is in the file itself
    return storage


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL; None for another database or an in-memory one."""
    # SQLAlchemy (Optuna's storage) only when a storage URL is given
    from sqlalchemy.engine import make_url

    parsed = make_url(database_url(url))
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _study_template() -> Path | None:
    """Where the empty study file of this Optuna and SQLAlchemy is kept; None when the cache is off."""
    folder = cache_folder(STUDY_CACHE_ENV, "studies")
    if folder is None:
        return None
    return folder / f"empty-optuna-{optuna.__version__}-sqlalchemy-{sqlalchemy.__version__}.db"


def _write_ahead_log(storage) -> None:
    """SQLite in write-ahead-log mode (a setting of the file, kept): readers no longer block the writer nor it
    them, so workers' polls, heartbeats and claims do not queue behind each other (sqlite.org/wal.html)."""
    if storage.engine.url.get_backend_name() == "sqlite":
        with storage.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")


def _sync_at_checkpoints(storage) -> None:
    """Each SQLite connection with synchronous=NORMAL: in WAL mode a commit then needs no fsync of its own
    (the WAL is synced at checkpoints) and the file still cannot be corrupted; a power cut may only undo the
    last commits, so a claimed trial runs again (sqlite.org/pragma.html#pragma_synchronous). A trial makes
    a dozen commits (claim, heartbeats, attributes, its outcome)."""
    if storage.engine.url.get_backend_name() != "sqlite":
        return

    def on_connect(connection, _record):
        connection.execute("PRAGMA synchronous=NORMAL")

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # the connections opened so far were made before the listener


def _redacted(url: str) -> str:
    # SQLAlchemy (Optuna's storage) only when a storage URL is given
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def check_storage_url(url: str) -> None:
    # SQLAlchemy (Optuna's storage) only when a storage URL is given
    from sqlalchemy.engine import make_url

    try:
        make_url(url)
    except Exception:
        raise UserError(f"--storage {url}: not a database URL (e.g. postgresql://user:password@host/db, "
                        "sqlite:///path/study.db)") from None


@contextmanager
def _setup_lock(folder: Path):
    """Serialises set-up among this machine's workers (the SQLite schema is created on first open)."""
    with open(folder / ".setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def open_study(sweep: Sweep, sweep_dir: Path, name: str, url: str, worker: bool = False):
    """(study, storage): the study `name`, created with its whole queue, or the one that exists,
    which must be this same sweep. `worker`: a `--worker` child of this machine's sweep command, which
    opens the study (it waits for that) and checks it: the child loads it without the set-up lock and
    schema checks."""
    pruner = optuna.pruners.MedianPruner(n_startup_trials=PRUNE_AFTER_TRIALS) if sweep.prune \
        else optuna.pruners.NopPruner()
    if worker:
        _wait_for_study(sweep_dir, url)
        storage = _storage(url, checked=True)
        _sync_at_checkpoints(storage)
        study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(sweep), pruner=pruner)
        _check_same_sweep(study, sweep, sweep_dir, url)
        return study, storage
    with _setup_lock(sweep_dir):
        storage = _new_storage(url)
        _write_ahead_log(storage)
        _sync_at_checkpoints(storage)
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
            raise UserError(f"{_redacted(url)}: the sweep command that started this worker never opened its study")
        time.sleep(0.05)


def _check_same_sweep(study, sweep: Sweep, sweep_dir: Path, url: str) -> None:
    deadline = time.monotonic() + SETUP_WAIT_S
    while "sweep" not in study.user_attrs:
        if time.monotonic() > deadline:
            raise UserError(f"study '{study.study_name}' in {_redacted(url)} was created but its trials were never "
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
