"""Hostile environments: a COLUMNS of 0, a reader that goes away, a memory limit, a non-UTF-8 data path,
a hangup. Each ends in one line (or, with no reader left, in SIGPIPE's exit code) and leaves no half-made
run folder and no temporary file."""

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from tests.cli.test_cli import REPO, assert_clean_failure, mlptrain
from tests.cli.test_data_cli import tiny_npz

TINY = ["adam_mnist", "backend=cpu", "train.epochs=1", "model.hidden=[8]", "train.batch_size=16",
        "data.dataset=npz", "data.val_size=10"]


def test_columns_zero_still_prints_the_refusal(tmp_path):
    for columns in ("0", "00", "3"):
        result = mlptrain("run", "missing.yaml", cwd=tmp_path, env={"COLUMNS": columns})
        assert_clean_failure(result, "no such config file")


def test_a_reader_gone_ends_the_run_as_sigpipe_does_and_removes_its_folder(tmp_path):
    tiny_npz(tmp_path / "tiny.npz", np.random.default_rng(0))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "mlptrain", "run", *TINY, "data.path=tiny.npz", "--runs-dir",
                             "runs", "--name", "r"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr.readline()  # `| head -1`: one line read, then the reader goes
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141
    assert not (tmp_path / "runs" / "r").exists()
    # the name is free again, and a run with a reader finishes whole
    result = mlptrain("run", *TINY, "data.path=tiny.npz", "--runs-dir", "runs", "--name", "r", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs" / "r" / "summary.json").is_file()


def test_a_memory_limit_is_refused_before_the_run_folder(tmp_path, data_dir):
    code = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, resource.RLIM_INFINITY));"
            "sys.argv = ['mlptrain'] + sys.argv[1:]; runpy.run_module('mlptrain', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code, "run", "adam_mnist", "backend=cpu", "train.epochs=1",
                             "model.hidden=[12000,12000]", "--runs-dir", "runs", "--name", "m"], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert_clean_failure(result, "of host memory, more than the")
    assert "free under ulimit -v" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_non_utf8_data_path_still_writes_the_summary(tmp_path):
    folder = os.path.join(os.fsencode(tmp_path), b"d\xff")
    os.mkdir(folder)  # the data root, recorded in config.yaml and TensorBoard's hparams
    tiny_npz(tmp_path / "tiny.npz", np.random.default_rng(0))
    result = subprocess.run([sys.executable, "-m", "mlptrain", "run", *TINY, "data.path=tiny.npz", "--runs-dir",
                             "runs", "--name", "u"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO), "MLPTRAIN_DATA_DIR": os.fsdecode(folder)})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    summary = json.loads((tmp_path / "runs" / "u" / "summary.json").read_text())
    assert summary["epochs"] == 1


def test_sighup_stops_like_sigterm_and_leaves_no_temporary_file(tmp_path, data_dir):
    proc = subprocess.Popen([sys.executable, "-m", "mlptrain", "run", "adam_mnist", "backend=cpu", "train.epochs=1",
                             "--runs-dir", "runs", "--name", "h"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 120
    while not (tmp_path / "runs" / "h" / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # into the training steps
    proc.send_signal(signal.SIGHUP)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 129, err
    assert "Traceback" not in err and "resume with: mlptrain run --resume" in err
    assert (tmp_path / "runs" / "h" / "checkpoints" / "last.npz").is_file()
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.name.endswith(".tmp")]


def _main_raising(monkeypatch, error):
    import mlptrain.cli as cli

    def app(**kwargs):
        raise error

    monkeypatch.setattr(cli, "app", app)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # _main sets its own: put back after
    try:
        cli._main()
    except SystemExit as done:
        return done.code
    return 0


def test_a_memory_error_anywhere_is_one_line(monkeypatch, capsys):
    error = MemoryError("Unable to allocate 3.00 GiB for an array with shape (1,) and data type float64")
    assert _main_raising(monkeypatch, error) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory: allocating 3.00 GiB") and err.count("\n") == 1


def test_a_thread_that_cannot_start_is_out_of_memory_and_other_runtime_errors_pass(monkeypatch, capsys):
    assert _main_raising(monkeypatch, RuntimeError("can't start new thread")) == 2
    assert "error: out of memory: starting a thread failed" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="a bug"):
        _main_raising(monkeypatch, RuntimeError("a bug"))
