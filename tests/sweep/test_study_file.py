"""A new SQLite study (named by --storage) starts as a copy of an empty one, kept per Optuna and SQLAlchemy version, so
that Optuna does not make its tables and Alembic stamp again; the copy is made by the first sweep, and a
damaged copy is replaced, never trusted."""

import optuna
import pytest

from mlptrain.sweep import study_trials
from mlptrain.sweep import database
from mlptrain.sweep import study as studies
from mlptrain.sweep.spec import load_sweep
from tests.sweep.test_sweep import FAST, write_sweep


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(database.STUDY_CACHE_ENV, str(folder))
    return folder


def _open(tmp_path, name):
    spec = load_sweep(write_sweep(tmp_path, {"seed": [0, 1, 2]}), FAST)
    folder = tmp_path / name
    folder.mkdir()
    study, storage = studies.open_study(spec, folder, name, f"sqlite:///{folder / 'study.db'}")
    return study, storage


def _queued(study):
    return [t.params or t.system_attrs.get("fixed_params") for t in study.get_trials()]


def test_the_first_study_leaves_an_empty_copy_that_the_next_starts_from(tmp_path, cache, monkeypatch):
    study, _ = _open(tmp_path, "first")
    copies = list(cache.iterdir())
    assert len(copies) == 1 and optuna.__version__ in copies[0].name
    made = []

    class Recorded(optuna.storages.RDBStorage):
        def __init__(self, url, **kwargs):
            made.append(kwargs["skip_table_creation"])
            super().__init__(url, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Recorded)
    second, storage = _open(tmp_path, "second")
    assert made == [True]  # opened from the copy, its tables and version checks not made again
    assert _queued(second) == _queued(study) == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    claimed = study_trials.claim_next(second, storage, storage.get_study_id_from_name("second"))
    assert claimed is not None  # a working study: the claim's own SQL runs on the copied tables
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["second"]  # nothing of the first


def test_a_damaged_copy_is_replaced_by_a_fresh_file(tmp_path, cache):
    _open(tmp_path, "first")
    (copy,) = cache.iterdir()
    copy.write_bytes(b"not a database")
    study, _ = _open(tmp_path, "second")
    assert _queued(study) == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    assert copy.read_bytes()[:16] == b"SQLite format 3\x00"  # made again from the fresh file


def test_off_and_other_databases_make_the_study_as_optuna_does(tmp_path, monkeypatch):
    monkeypatch.setenv(database.STUDY_CACHE_ENV, "off")
    study, _ = _open(tmp_path, "plain")
    assert _queued(study) == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    assert database.sqlite_file("postgresql://u:p@host/db") is None
    assert database.sqlite_file("sqlite:///:memory:") is None
