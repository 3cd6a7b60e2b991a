"""The command line as a user meets it: real subprocesses, real files."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ON_SIMULATOR

REPO = Path(__file__).resolve().parents[2]


def mlptrain(*args, cwd, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "mlptrain", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=600)


def assert_clean_failure(result, fragment):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0], lines[0]


def trained_as_configured(run_dir: Path) -> Path:
    """`run_dir` with its checkpoints' record of the config made what its (edited) config.yaml says, as if the
    run had trained with it: commands that read a run refuse a config.yaml edited after training."""
    from mlptrain.config.load import load_config
    from mlptrain.training.resume import training_config

    record = json.dumps(training_config(load_config(run_dir / "config.yaml")), sort_keys=True).encode()
    for checkpoint in (run_dir / "checkpoints").glob("*.npz"):
        arrays = dict(np.load(checkpoint))
        arrays["meta/config"] = np.frombuffer(record, np.uint8)
        np.savez(checkpoint, **arrays)
    return run_dir


def test_configs_lists_builtins(tmp_path):
    result = mlptrain("configs", cwd=tmp_path)
    assert result.returncode == 0
    for name in ("sgd_mnist", "momentum_mnist", "adam_mnist", "adamw_mnist"):
        assert name in result.stdout + result.stderr


def test_configs_show_prints_yaml(tmp_path):
    result = mlptrain("configs", "show", "adam_mnist", cwd=tmp_path)
    assert result.returncode == 0 and "name: adam" in result.stdout


@pytest.mark.parametrize("args, fragment", [
    (["adam_mnist", "optim.lrr=0.1"], "did you mean 'optim.lr'"),
    (["adam_mnist", "optim.lr=-1"], "override optim.lr=-1: must be > 0"),
    (["adam_mnist", "train.epochs=two"], "override train.epochs=two: expected int"),
    (["missing.yaml"], "no such config file"),
    (["adam_mnist", "--name", "../escape"], "--name '../escape'"),
    (["adam_mnist", "--name", ".hidden"], "--name '.hidden'"),
    (["adam_mnist", "--name", "../x"], "--name '../x'"),
    (["adam_mnist", "--name", "ok/../../x"], "--name 'ok/../../x'"),
    (["adam_mnist", "--name", "/tmp/x"], "--name '/tmp/x'"),
    (["adam_mnist", "data.val_size=60000", "backend=cpu"], "data.val_size"),
    # refused when the model is built, after the config and the data: still before the run directory
    (["autoencoder_cifar10", "backend=cpu", "model.channels=[4,4,4,4,4,4]"], "model.channels: 6 conv"),
])
def test_bad_input_fails_cleanly_and_writes_nothing(tmp_path, data_dir, args, fragment):
    result = mlptrain("run", *args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path,
                      env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert_clean_failure(result, fragment)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert not (tmp_path / "escape").exists() and not (tmp_path / "x").exists()


@pytest.mark.skipif(not ON_SIMULATOR, reason="a real GPU is present")
def test_cuda_without_gpu_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-m", "mlptrain", "run", "adam_mnist", "backend=cuda",
                             "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert_clean_failure(result, "backend=cuda")
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(not ON_SIMULATOR, reason="a real GPU is present")
def test_auto_without_gpu_warns_once_and_records_it(tmp_path, data_dir):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, "-m", "mlptrain", "run", "adam_mnist", "train.epochs=1",
                             "model.hidden=[8]", "train.batch_size=500", "--name", "auto",
                             "--runs-dir", str(tmp_path / "runs")],
                            cwd=tmp_path, env={**env, "MLPTRAIN_DATA_DIR": str(data_dir)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: backend auto: no usable GPU ("), result.stderr
    summary = json.loads((tmp_path / "runs" / "auto" / "summary.json").read_text())
    assert summary["backend"] == "cpu" and summary["device"] == "cpu (NumPy)"
    assert summary["fallbacks"] == [warnings[0].removeprefix("warning: ")]
    dataset = summary["dataset"]  # mlptrain.data.dataset_record; tests/data check the rest of it
    assert (dataset["name"], dataset["train"], dataset["val"], dataset["test"], dataset["subset"]) == (
        "mnist", 55000, 5000, 10000, False)


@pytest.mark.slow
def test_adam_mnist_one_epoch_on_cpu(tmp_path, data_dir):
    """The issue's acceptance run: the built-in config, one epoch, CPU backend, >= 96% test accuracy."""
    result = mlptrain("run", "configs/adam_mnist.yaml", "backend=cpu", "train.epochs=1", "--name", "e2e",
                      "--runs-dir", str(tmp_path / "runs"), cwd=REPO,
                      env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs" / "e2e"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_acc"] >= 0.96
    assert summary["optimizer_steps"] == 430 and summary["epochs"] == 1
    for key in ("test_loss", "val_acc", "samples_per_s", "wall_s"):
        assert summary[key] > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["epoch"] == 1
    # the epoch's training means beside val and test, and the same record as a table
    assert list(records[0])[:4] == ["epoch", "step", "train_loss", "train_acc"]
    assert 0 < records[0]["train_loss"] < 1 and 0.8 < records[0]["train_acc"] < 1
    header, row = (run / "metrics.csv").read_text().splitlines()
    assert header.split(",") == list(records[0]) and [float(v) for v in row.split(",")] == list(records[0].values())
    assert "epoch 1: train loss" in result.stderr
    with np.load(run / "checkpoints" / "last.npz", allow_pickle=False) as ckpt:
        assert ckpt["params/fc1.weight"].shape == (784, 512)
        assert ckpt["optim/m"].shape == ckpt["optim/v"].shape == (669706,)
    assert (run / "checkpoints" / "best.npz").exists()
    assert "optim:" in (run / "config.yaml").read_text()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss/train", "accuracy/train", "loss/val", "accuracy/val", "loss/test", "opt/lr",
            "perf/samples_per_s"} <= tags


def test_existing_run_name_is_refused(tmp_path, data_dir):
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    result = mlptrain("run", "adam_mnist", "backend=cpu", "--name", "taken", "--runs-dir", str(tmp_path / "runs"),
                      cwd=tmp_path, env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert_clean_failure(result, "a run of that name exists")


@pytest.mark.parametrize("args, fragment", [
    (["export", "runs/x"], "mlptrain export: Missing option '--format'"),
    (["predict"], "mlptrain predict: Missing argument 'RUN_DIR'"),
    (["evaluate", "runs/x", "--bogus"], "mlptrain evaluate: No such option: --bogus"),
    (["bogus"], "mlptrain: No such command 'bogus'"),
    (["configs", "bogus"], "mlptrain configs: No such command 'bogus'"),
])
def test_usage_mistakes_are_one_line_too(tmp_path, args, fragment):
    """Click's usage errors (a missing or unknown option, argument or command) print one line naming the
    command and where its help is, not a usage block and a boxed message."""
    result = mlptrain(*args, cwd=tmp_path)
    assert_clean_failure(result, fragment)
    assert "--help` lists what it takes" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_any_command_is_one_line_and_its_exit_code(tmp_path, signum):
    """SIGTERM kept its default action outside `run` and `sweep`: evaluate, predict, export, svm, ... died
    with no word (exit -15) and left an atomic write's temporary file; Typer also reported it as 130."""
    script = ("import sys, time\nfrom mlptrain import cli\n"
              "@cli.app.command('nap')\ndef nap():\n    print('ready', flush=True)\n    time.sleep(60)\n"
              "sys.argv = ['mlptrain', 'nap']\ncli.main()\n")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert process.stdout.readline() == "ready\n", process.communicate()
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 128 + signum, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == ["interrupted"], stderr


def test_resume_with_a_config_says_the_run_has_its_own(tmp_path):
    result = mlptrain("run", "adam_mnist", "--resume", str(tmp_path / "runs" / "x"), cwd=tmp_path)
    assert_clean_failure(result, "continues the run with its own config.yaml: drop 'adam_mnist' (only "
                                 "train.epochs=N may be given")


def test_an_unusable_backend_option_is_refused_in_the_options_words(monkeypatch):
    from mlptrain.backends import cuda
    from mlptrain.cli.options import backend_name
    from mlptrain.errors import UserError

    monkeypatch.setattr(cuda, "cuda_unusable_reason", lambda: "no CUDA driver: libcuda.so.1 not found")
    with pytest.raises(UserError, match=r"^--backend cuda: no usable NVIDIA GPU or CUDA driver \(no CUDA driver: "
                                        r"libcuda.so.1 not found\); use --backend cpu or --backend auto$"):
        backend_name("cuda")
    assert backend_name("cpu") == "cpu" and backend_name("auto") == "auto"


def test_a_diverging_run_says_so_in_one_line_without_numpys_warnings(tmp_path, data_dir):
    """The CPU kernels overflow first; NumPy's RuntimeWarnings (with file paths) no longer print before the
    loop's own line."""
    result = mlptrain("run", "sgd_mnist", "backend=cpu", "optim.lr=1000", "train.epochs=1", "model.hidden=[16]",
                      "data.val_size=1000", cwd=tmp_path, env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert result.returncode == 2, result.stderr
    out = result.stdout + result.stderr
    assert "RuntimeWarning" not in out and "numpy_kernels" not in out and "Traceback" not in out
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the training loss became nan" in errors[0] and "optim.lr=1000" in errors[0]


def test_help_shows_no_type_beside_a_flag_and_names_the_cpu_backend(tmp_path):
    """`<bool>` beside --force and --help read as a value to give; the top-level help said NVIDIA GPUs only."""
    top = mlptrain("--help", cwd=tmp_path, env={"COLUMNS": "200"})
    assert top.returncode == 0 and "backend: cpu" in top.stdout and "NumPy" in top.stdout
    for command in ("run", "sweep", "evaluate", "predict", "export", "svm", "compare"):
        shown = mlptrain(command, "--help", cwd=tmp_path, env={"COLUMNS": "200"})
        assert shown.returncode == 0 and "--help" in shown.stdout, shown.stderr
        assert "<bool>" not in shown.stdout, command
    assert "<bool>" not in top.stdout
