"""Where a sweep's study lives, named and checked without importing Optuna: `--storage` is refused in one line
before the sweep's data is loaded or its folder made (mlptrain.sweep.study opens it)."""

from __future__ import annotations

from pathlib import Path

from mlptrain.errors import UserError

JOURNAL, DATABASE = "study.journal", "study.db"  # a sweep folder's own study: the default, and before it


def default_storage(sweep_dir: Path) -> str:
    """The study of the sweep in `sweep_dir` when --storage names none: its journal file, or the SQLite file
    an earlier version made there, so that re-running that sweep continues it. Either one a link is refused:
    the sweep appends to its study, and --storage is the way to name one elsewhere."""
    for name in (JOURNAL, DATABASE):
        if (sweep_dir / name).is_symlink():
            raise UserError(f"{sweep_dir / name}: a symbolic link inside a sweep folder; mlptrain never writes a "
                            "sweep's study through a link: remove it, or name the study with --storage")
    if (sweep_dir / DATABASE).exists() and not (sweep_dir / JOURNAL).exists():
        return f"sqlite:///{(sweep_dir / DATABASE).resolve()}"
    return str((sweep_dir / JOURNAL).resolve())


def is_database(location: str) -> bool:
    """Whether a storage is a database URL (`scheme://...`); anything else is a journal file's path."""
    return "://" in location


def absolute(location: str) -> str:
    """A journal file's path made absolute (a `--worker` child or a later command may start elsewhere); a
    database URL as it is."""
    return location if is_database(location) else str(Path(location).resolve())


def described(location: str) -> str:
    """The storage as messages name it: a database URL without its password."""
    if not is_database(location):
        return location
    # SQLAlchemy only for a database study: it takes half a second to import
    from mlptrain.sweep.database import redacted

    return redacted(location)


def check_storage(location: str) -> None:
    """One line, before anything is written, when --storage can be neither a database URL nor a journal file."""
    if is_database(location):
        # SQLAlchemy only for a database study: it takes half a second to import
        from mlptrain.sweep.database import check_database_url

        check_database_url(location)
        return
    path = Path(location)
    if path.is_dir():
        raise UserError(f"--storage {location}: is a folder; name a journal file (e.g. {path / JOURNAL}) or a "
                        "database URL (e.g. postgresql://user:password@host/db, sqlite:///path/study.db)")
    if not path.parent.is_dir():
        raise UserError(f"--storage {location}: its folder {path.parent} does not exist; name a journal file in "
                        "an existing folder, or a database URL (e.g. postgresql://user:password@host/db)")
