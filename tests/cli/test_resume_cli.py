"""Ctrl-C, SIGTERM, --resume and divergence as a user meets them: real subprocesses, real MNIST, CPU."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mlptrain.training.checkpoint import load_checkpoint
from tests.cli.test_cli import assert_clean_failure, mlptrain

# a small MLP trains an MNIST epoch on the CPU in well under a second: enough epochs to interrupt
SMALL = ["adam_mnist", "backend=cpu", "model.hidden=[16]", "train.epochs=20", "train.log_every=5"]


def start(args, tmp_path, data_dir):
    return subprocess.Popen([sys.executable, "-m", "mlptrain", "run", *args], cwd=tmp_path,
                            env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_first_epoch(run_dir, process, timeout=120):
    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().strip()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no epoch finished"
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_checkpoints_and_the_resumed_run_matches_one_never_interrupted(tmp_path, data_dir, signum):
    runs = tmp_path / "runs"
    process = start([*SMALL, "--name", "stopped", "--runs-dir", str(runs)], tmp_path, data_dir)
    wait_for_first_epoch(runs / "stopped", process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    last_line = [line for line in stderr.splitlines() if line.strip()][-1]
    assert "interrupted " in last_line and "optimizer steps in all" in last_line and f"resume with: mlptrain run --resume {runs / 'stopped'}" \
        in last_line.replace("\n", "")
    saved = load_checkpoint(runs / "stopped" / "checkpoints" / "last.npz")
    assert 1 <= int(saved["meta/epoch"]) < 20 and not (runs / "stopped" / "summary.json").exists()
    if signum == signal.SIGTERM:
        return

    resumed = mlptrain("run", "--resume", str(runs / "stopped"), cwd=tmp_path,
                       env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert resumed.returncode == 0, resumed.stderr
    whole = mlptrain("run", *SMALL, "--name", "whole", "--runs-dir", str(runs), cwd=tmp_path,
                     env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert whole.returncode == 0, whole.stderr
    a, b = (load_checkpoint(runs / name / "checkpoints" / "last.npz") for name in ("stopped", "whole"))
    assert sorted(a) == sorted(b)
    for key in a:
        if key != "meta/wall_s":  # a measured time
            np.testing.assert_array_equal(a[key], b[key], err_msg=key, strict=True)
    records = [json.loads(line) for line in (runs / "stopped" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(1, 21))
    summary = json.loads((runs / "stopped" / "summary.json").read_text())
    assert summary["optimizer_steps"] == json.loads((runs / "whole" / "summary.json").read_text())["optimizer_steps"]
    assert summary["resumed"] and summary["wall_s_total"] > summary["wall_s"]  # both parts counted


def test_resume_extends_a_finished_run_and_refuses_other_changes(tmp_path, data_dir):
    env, runs = {"MLPTRAIN_DATA_DIR": str(data_dir)}, tmp_path / "runs"
    args = ["adam_mnist", "backend=cpu", "model.hidden=[16]", "train.epochs=1", "--runs-dir", str(runs)]
    assert mlptrain("run", *args, "--name", "done", cwd=tmp_path, env=env).returncode == 0
    run_dir = str(runs / "done")
    assert_clean_failure(mlptrain("run", "--resume", run_dir, cwd=tmp_path, env=env), "already trained 1 epochs")
    assert_clean_failure(mlptrain("run", "--resume", run_dir, "optim.lr=0.1", cwd=tmp_path, env=env),
                         "override 'optim.lr' would change the run")
    assert_clean_failure(mlptrain("run", "--resume", run_dir, "--name", "x", cwd=tmp_path, env=env), "drop --name")
    result = mlptrain("run", "--resume", run_dir, "train.epochs=2", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads((runs / "done" / "summary.json").read_text())["optimizer_steps"] == 2 * 430
    assert len((runs / "done" / "metrics.jsonl").read_text().splitlines()) == 2


def test_resume_with_a_checkpoint_of_another_model_is_one_line(tmp_path, data_dir):
    env, runs = {"MLPTRAIN_DATA_DIR": str(data_dir)}, tmp_path / "runs"
    assert mlptrain("run", "adam_mnist", "backend=cpu", "model.hidden=[16]", "train.epochs=1", "--name", "a",
                    "--runs-dir", str(runs), cwd=tmp_path, env=env).returncode == 0
    config = runs / "a" / "config.yaml"
    config.write_text(config.read_text().replace("- 16", "- 24"))
    result = mlptrain("run", "--resume", str(runs / "a"), "train.epochs=2", cwd=tmp_path, env=env)
    assert_clean_failure(result, "model.hidden ([16] -> [24])")


def make_dir_without_a_checkpoint(root):
    root.mkdir()
    (root / "config.yaml").write_text("backend: cpu\n")


@pytest.mark.parametrize("make, fragment", [
    (lambda root: None, "no such run directory"),
    (lambda root: root.mkdir(), "no config.yaml"),
    (make_dir_without_a_checkpoint, "no checkpoints/last.npz"),
], ids=["missing", "not_a_run", "no_checkpoint"])
def test_resume_of_a_dir_that_is_no_run(tmp_path, data_dir, make, fragment):
    make(tmp_path / "target")
    result = mlptrain("run", "--resume", str(tmp_path / "target"), cwd=tmp_path,
                      env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert_clean_failure(result, fragment)
    assert not (tmp_path / "runs").exists()


def test_neither_config_nor_resume(tmp_path):
    assert_clean_failure(mlptrain("run", cwd=tmp_path), "give a CONFIG")


@pytest.mark.parametrize("damage, fragment", [
    (lambda path: path.write_bytes(path.read_bytes()[:5000]), "train-images-idx3-ubyte.gz"),
    (lambda path: path.write_bytes(b"not gzip at all"), "train-images-idx3-ubyte.gz"),
], ids=["truncated", "garbage"])
def test_a_corrupt_mnist_file_fails_cleanly_before_the_run_dir(tmp_path, data_dir, damage, fragment):
    root = tmp_path / "data"
    shutil.copytree(data_dir / "mnist", root / "mnist")
    damage(root / "mnist" / "train-images-idx3-ubyte.gz")
    result = mlptrain("run", "adam_mnist", "backend=cpu", f"data.root={root}", "--runs-dir", str(tmp_path / "runs"),
                      cwd=tmp_path)
    assert_clean_failure(result, fragment)
    assert not (tmp_path / "runs").exists()


def test_a_diverging_run_stops_with_the_step_and_the_learning_rate(tmp_path, data_dir):
    result = mlptrain("run", "adam_mnist", "backend=cpu", "model.hidden=[16]", "train.epochs=1", "optim.name=sgd",
                      "optim.lr=1e6", "--name", "nan", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path,
                      env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last_line = [line for line in result.stderr.splitlines() if line.strip()][-1]
    assert "at optimizer step" in last_line and "optim.lr=1000000.0 is likely too high" in last_line
    assert not (tmp_path / "runs" / "nan" / "checkpoints" / "last.npz").exists()
