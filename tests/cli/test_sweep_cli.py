"""`mlptrain sweep` as a user meets it: real processes on the real MNIST."""

import json
import re

import yaml

from tests.cli.test_cli import REPO, assert_clean_failure, mlptrain

FAST = ["backend=cpu", "train.epochs=1", "model.hidden=[16]", "train.batch_size=1000", "data.val_size=1000",
        "train.eval_batch_size=5000"]


def write_sweep(folder, **fields):
    path = folder / "lr.yaml"
    path.write_text(yaml.safe_dump({"base": "adam_mnist", "metric": "val_acc", **fields}, sort_keys=False))
    return path


def test_a_two_point_grid_completes_and_ranks_both(tmp_path, data_dir):
    path = write_sweep(tmp_path, parameters={"optim.lr": [1.0e-3, 1.0e-2]})
    result = mlptrain("sweep", str(path), *FAST, "--runs-dir", str(tmp_path / "runs"), cwd=REPO,
                      env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "runs" / "lr" / "results.json").read_text())
    trials = sorted(results["trials"], key=lambda t: -t["value"])
    assert [t["state"] for t in trials] == ["complete", "complete"] and results["best"] == trials[0]["number"]
    assert {t["params"]["optim.lr"] for t in trials} == {1.0e-3, 1.0e-2}
    rows = [line for line in result.stderr.splitlines() if line.startswith("│") and "complete" in line]
    assert len(rows) == 2 and "1 best" in rows[0] and f"trial-{trials[0]['number']:04d}" in rows[0]


def test_workers_share_the_grid_in_child_processes(tmp_path, data_dir):
    path = write_sweep(tmp_path, parameters={"optim.lr": [1.0e-3, 3.0e-3, 1.0e-2]})
    result = mlptrain("sweep", str(path), *FAST, "--workers", "2", "--name", "two", "--runs-dir",
                      str(tmp_path / "runs"), cwd=REPO, env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert result.returncode == 0, result.stderr
    sweep_dir = tmp_path / "runs" / "two"
    results = json.loads((sweep_dir / "results.json").read_text())
    assert sorted(t["params"]["optim.lr"] for t in results["trials"]) == [1.0e-3, 3.0e-3, 1.0e-2]
    assert all(t["state"] == "complete" for t in results["trials"])
    assert not (sweep_dir / "worker-0.log").exists()  # worker 0 is the command itself
    outputs = [result.stderr, (sweep_dir / "worker-1.log").read_text()]
    ran = [len(re.findall(r"^trial \d+: optim\.lr=", out, re.M)) for out in outputs]
    assert sum(ran) == 3, outputs


def test_a_bad_sweep_fails_cleanly_and_creates_nothing(tmp_path):
    path = write_sweep(tmp_path, parameters={"optim.lrr": [1.0e-3]})
    result = mlptrain("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_clean_failure(result, "did you mean 'optim.lr'")
    assert not (tmp_path / "runs").exists()


def test_a_missing_sweep_names_the_builtin_ones(tmp_path):
    result = mlptrain("sweep", "nowhere.yaml", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_clean_failure(result, "sweep_lr_mnist")


def test_builtin_sweeps_are_listed_in_their_own_section_and_shown(tmp_path):
    result = mlptrain("configs", cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "adam_mnist" in out
    assert out.index("built-in sweeps") < out.index("sweep_lr_mnist")  # after the configs, under their own title
    assert out.index("adam_mnist") < out.index("built-in sweeps")
    shown = mlptrain("configs", "show", "sweep_lr_mnist", cwd=tmp_path)
    assert shown.returncode == 0 and "base: adam_mnist.yaml" in shown.stdout


def test_the_default_study_is_a_journal_file_and_needs_no_database_library(tmp_path, data_dir):
    """SQLAlchemy takes half a second to import and a new SQLite study as long again to make: a sweep's own
    study is Optuna's journal file, and the command never imports SQLAlchemy for it."""
    path = write_sweep(tmp_path, parameters={"optim.lr": [1.0e-3]})
    result = mlptrain("sweep", str(path), *FAST, "--runs-dir", str(tmp_path / "runs"), cwd=REPO,
                      env={"MLPTRAIN_DATA_DIR": str(data_dir), "PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "optuna" in imported and not {m for m in imported if m.split(".")[0] in ("sqlalchemy", "alembic")}
    assert sorted(p.name for p in (tmp_path / "runs" / "lr").glob("study.*")) == ["study.journal"]


def test_a_storage_that_is_neither_a_database_nor_a_journal_is_refused_in_one_line(tmp_path):
    path = write_sweep(tmp_path, parameters={"optim.lr": [1.0e-3]})
    not_a_journal = tmp_path / "study.db"
    not_a_journal.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 4)
    for storage, fragment in ((tmp_path, "is a folder"), (tmp_path / "no" / "study.journal", "does not exist"),
                              (not_a_journal, "sqlite:///"), ("nodb://", "cannot open it")):
        result = mlptrain("sweep", str(path), "backend=cpu", "--storage", str(storage), "--runs-dir",
                          str(tmp_path / "runs"), cwd=tmp_path)
        assert_clean_failure(result, fragment)
        assert not (tmp_path / "runs" / "lr").exists()
