"""Optuna's database storages (SQLite, PostgreSQL, any URL SQLAlchemy takes): opened quietly, a new SQLite
file from a copy of an empty one, SQLite in write-ahead-log mode. Imported only when a sweep's storage is a
database: SQLAlchemy alone takes about half a second to import (mlptrain.sweep.study)."""

from __future__ import annotations

import shutil
import warnings
from contextlib import contextmanager, suppress
from importlib.util import find_spec
from pathlib import Path

import optuna
import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import make_url

from mlptrain.errors import UserError
from mlptrain.sweep.liveness import GRACE_S, HEARTBEAT_S
from mlptrain.util.atomic import replacing
from mlptrain.util.interrupts import raise_interruption
from mlptrain.util.user_paths import cache_folder

STUDY_CACHE_ENV = "MLPTRAIN_STUDY_CACHE"  # where the empty study file is kept (see new_database)


@contextmanager
def _quiet():
    """Heartbeats are marked experimental in Optuna; the warning would print on every run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def database_url(url: str) -> str:
    """`url` with a PostgreSQL driver named when it names none: SQLAlchemy 2.1's default for postgresql://
    is psycopg 3, so psycopg2 alone would fail; whichever is installed is used, psycopg first."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    rest = url.split("://", 1)[1]
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise UserError(f"--storage {redacted(url)}: no PostgreSQL driver is installed; pip install 'mlptrain[postgres]' "
                    "(psycopg 3), or psycopg2 and write postgresql+psycopg2://")


def open_database(url: str, checked: bool = False):
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
        raise_interruption(err)  # Ctrl-C while a driver imports is no bad URL
        raise UserError(f"--storage {redacted(url)}: cannot open it ({type(err).__name__}: {err})") from None


def new_database(url: str):
    """The storage of a new study at `url`. A new SQLite file starts as a copy of an empty one made before by
    this Optuna and SQLAlchemy (kept in $MLPTRAIN_STUDY_CACHE, else the user cache folder's
    mlptrain/studies; `off` turns it off), so that its tables and Alembic's stamp are not made again:
    Optuna reads its ~30 migration scripts for that, about a third of a second before the first trial. The
    first new file on a machine is made by Optuna and copied there."""
    database = sqlite_file(url)
    template = study_template()
    if database is None or template is None or database.exists():
        return open_database(url)
    try:
        with open(template, "rb") as source, open(database, "xb") as target:  # never over another's file
            shutil.copyfileobj(source, target)
        return open_database(url, checked=True)
    except FileExistsError:  # another command made it meanwhile: it is opened as it is
        return open_database(url)
    except FileNotFoundError:  # no copy yet: Optuna makes the file, and it is copied for the next study
        pass
    except (OSError, UserError):  # an unreadable or damaged copy: Optuna makes the file afresh
        database.unlink(missing_ok=True)
    storage = open_database(url)
    with suppress(OSError):  # a cache that cannot be written only costs the next study the same time
        template.parent.mkdir(parents=True, exist_ok=True)
        with replacing(template, durable=False) as copy, open(database, "rb") as made:
            shutil.copyfileobj(made, copy)  # before WAL mode: every table is in the file itself
    return storage


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(database_url(url))
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def study_template() -> Path | None:
    """Where the empty study file of this Optuna and SQLAlchemy is kept; None when the cache is off."""
    folder = cache_folder(STUDY_CACHE_ENV, "studies")
    if folder is None:
        return None
    return folder / f"empty-optuna-{optuna.__version__}-sqlalchemy-{sqlalchemy.__version__}.db"


def write_ahead_log(storage) -> None:
    """SQLite in write-ahead-log mode (a setting of the file, kept): readers no longer block the writer nor it
    them, so workers' polls, heartbeats and claims do not queue behind each other (sqlite.org/wal.html)."""
    if storage.engine.url.get_backend_name() == "sqlite":
        with storage.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")


def sync_at_checkpoints(storage) -> None:
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


def redacted(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def check_database_url(url: str) -> None:
    try:
        make_url(url)
    except Exception:
        raise UserError(f"--storage {url}: not a database URL (e.g. postgresql://user:password@host/db, "
                        "sqlite:///path/study.db)") from None
