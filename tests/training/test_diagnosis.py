"""Runs that learn nothing say so, in one line kept in summary.json, and name the setting to blame; the
divergence stop names it too (it blamed the learning rate whatever had happened)."""

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from mlptrain.cli.configs import resolve_config
from mlptrain.config.load import load_config
from mlptrain.training.diagnosis import learning_warning, likely_cause
from mlptrain.util.console import show_warnings_as_lines
from tests.cli.test_cli import mlptrain


def _config(*overrides):
    return load_config(resolve_config("adam_mnist"), ["backend=cpu", *overrides])


@pytest.mark.parametrize("overrides, fragment", [
    (["optim.lr=1e6"], "optim.lr=1000000.0 is likely too high"),
    (["optim.name=sgd", "schedule.name=step", "schedule.gamma=1e7"], "schedule.gamma=1e+07 multiplies the learning"),
    (["train.precision=fp16", "train.loss_scale.init=1e300"], "train.loss_scale.init=1e+300 overflows"),
    (["train.precision=fp16", "train.loss_scale.init=1e-30"],
     "train.loss_scale.init=1e-30 lets the gradients underflow"),
    (["train.clip_grad_norm=1e-30"], "train.clip_grad_norm=1e-30 clips every update"),
    (["optim.weight_decay=1e6"], "optim.weight_decay=1e+06 is too strong"),
    (["optim.name=adamw", "optim.weight_decay=1e6"], "optim.weight_decay=1e+06 is too strong"),
    (["optim.name=sgd", "optim.lr=0.1", "optim.weight_decay=10"], "optim.weight_decay=10 is too strong"),
    ([], "optim.lr=0.001 is likely too high"),
])
def test_the_likely_cause_names_the_setting(overrides, fragment):
    assert fragment in likely_cause(_config(*overrides), {"steps": 10, "skipped": 0})


def test_a_run_that_learnt_nothing_with_no_suspect_setting_is_not_told_its_lr_is_too_high():
    assert "may be too high or too low, or the run too short" in likely_cause(_config(), diverged=False)


def test_an_fp16_run_that_skipped_most_steps_blames_the_loss_scale():
    cause = likely_cause(_config("train.precision=fp16", "optim.lr=10"), {"steps": 10, "skipped": 9})
    assert "loss scale" in cause and "9 steps skipped" in cause


def _dataset(test_labels):
    """What learning_warning reads of a dataset: its labels."""
    return SimpleNamespace(train_labels=np.arange(300) % 3, test_labels=np.asarray(test_labels))


def test_learning_warning_judges_against_chance_and_a_fresh_models_loss():
    data, config = _dataset(np.arange(150) % 3), _config()
    assert learning_warning(config, {"test_acc": 0.9, "test_loss": 0.3}, data, None, {}) is None
    line = learning_warning(config, {"test_acc": 0.34, "test_loss": 1.1}, data, None, {})
    assert line.startswith("the run learnt nothing: its test accuracy 0.3400 is no better than chance (0.3333)")
    line = learning_warning(config, {"test_acc": 0.6, "test_loss": float("nan")}, data, None, {})
    assert "test loss nan is no better than a fresh model's (1.099)" in line
    # too few test images to tell
    assert learning_warning(config, {"test_acc": 0.3, "test_loss": 9.0}, _dataset([0, 1, 2]), None, {}) is None
    # the autoencoder against the mean image
    assert "no better than the mean image's" in learning_warning(config, {"test_mse": 0.07}, data, 0.06, {})
    assert learning_warning(config, {"test_mse": 0.01}, data, 0.06, {}) is None


def test_python_warnings_are_one_clean_line(capsys):
    previous = warnings.showwarning
    try:
        show_warnings_as_lines()
        warnings.warn_explicit("overflow encountered\nin matmul", RuntimeWarning, "x.py", 1)
    finally:
        warnings.showwarning = previous
    err = capsys.readouterr().err
    assert err == "warning: overflow encountered in matmul (RuntimeWarning)\n"


def _learnable_npz(path, rng):
    """Three classes told apart by brightness: any working run learns them."""
    def split(n):
        y = np.arange(n) % 3
        return (y[:, None, None] * 100 + rng.integers(0, 30, (n, 6, 6))).astype(np.uint8), y
    (x_train, y_train), (x_test, y_test) = split(300), split(150)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


@pytest.mark.parametrize("overrides, code, fragment", [
    ([], 0, None),
    (["train.clip_grad_norm=1e-30"], 0, "warning: the run learnt nothing"),
    (["train.precision=fp16", "train.loss_scale.init=1e300"], 0, "train.loss_scale.init=1e+300 overflows"),
    (["optim.name=adamw", "optim.weight_decay=1e6"], 2, "error: the training loss became nan"),
])
def test_a_run_that_learns_nothing_says_why(tmp_path, overrides, code, fragment):
    _learnable_npz(tmp_path / "easy.npz", np.random.default_rng(0))
    result = mlptrain("run", "adam_mnist", "backend=cpu", "train.epochs=3", "model.hidden=[16]", "train.batch_size=32",
                      "optim.lr=0.01", "data.dataset=npz", "data.path=easy.npz", "data.val_size=30",
                      "train.log_every=1", *overrides, "--runs-dir", "runs", "--name", "r", cwd=tmp_path)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(("warning", "error"))]
    if fragment is None:
        assert lines == []
        assert json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())["warnings"] == []
        return
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    if code == 0:
        summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
        assert summary["warnings"] == [lines[0].removeprefix("warning: ")]
    else:
        assert "optim.weight_decay=1e+06 is too strong" in lines[0] and "learning rate" not in lines[0]
