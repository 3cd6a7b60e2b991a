"""Stopping and resuming a run (CPU backend, the small synthetic dataset of test_accumulation).

A run stopped after any optimizer step and resumed from its `last` checkpoint must end bitwise where
the run that never stopped ends: every parameter, optimizer buffer, step-state slot and grad-norm
record, the plateau schedule's state, the position and the best metric.
"""

import signal

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import config_to_dict
from mlptrain.errors import TrainingDiverged, TrainingInterrupted, UserError
from mlptrain.nn.params import FlatBuffer, Layout
from mlptrain.optim import Plateau
from mlptrain.run_dirs.folders import write_yaml
from mlptrain.training.checkpoint import load_checkpoint
from mlptrain.training.loop import train
from mlptrain.training.resume import prepare_resume
from mlptrain.training.session import build_session
from mlptrain.training.window import TrainingWindow
from tests.training.test_accumulation import make_config, synthetic_dataset

STEPS_PER_EPOCH = 4  # 900 training images in windows of 64 x 4

CASES = {
    "adamw-warmup_cosine-fp32": dict(optim={"name": "adamw", "lr": 0.01, "weight_decay": 0.01},
                                     schedule={"name": "warmup_cosine", "warmup_steps": 2, "min_lr": 1e-4},
                                     clip_grad_norm=1.0),
    "momentum-plateau-bf16": dict(optim={"name": "momentum", "lr": 0.3, "nesterov": True}, epochs=6,
                                  stop_epoch=4,  # val_acc stops improving in epoch 5: the plateau state matters
                                  schedule={"name": "plateau", "patience": 0, "factor": 0.5, "metric": "val_acc"},
                                  precision="bf16"),
    "adam-step-fp16": dict(optim={"name": "adam", "lr": 0.01}, schedule={"name": "step", "step_size": 1,
                                                                         "gamma": 0.5},
                           precision="fp16", loss_scale={"init": 2.0**30, "growth_interval": 3}),
    # val_acc improves by more than 0.025 last in epoch 4 and the run stops after epoch 6: stopped after
    # epoch 5, the resumed run must know that epoch 5 already did not improve (the counter is in the checkpoint)
    "adam-early_stopping-fp32": dict(optim={"name": "adam", "lr": 0.01}, schedule={"name": "constant"}, epochs=8,
                                     stop_epoch=5, early_stopping={"metric": "val_acc", "patience": 2,
                                                                   "min_delta": 0.025}),
}


def config_for(case):
    options = {"epochs": 3, **CASES[case]}
    options.pop("stop_epoch", None)
    return make_config(64, 4, options.pop("optim"), options.pop("schedule"), **options)


class StopAfterSteps:
    """Stands in for StopOnSignal: 'receives' SIGINT once `steps` optimizer steps have run."""

    def __init__(self, monkeypatch, steps):
        self.signum, self.steps = None, steps
        step = TrainingWindow.run

        def counting_step(window, *args):
            step(window, *args)
            self.steps -= 1
            if self.steps == 0:
                self.signum = signal.SIGINT

        monkeypatch.setattr(TrainingWindow, "run", counting_step)


def new_run(tmp_path, name, config):
    run_dir = tmp_path / name
    run_dir.mkdir()
    write_yaml(run_dir / "config.yaml", config_to_dict(config))
    return run_dir


def assert_same_checkpoint(a, b):
    a, b = load_checkpoint(a), load_checkpoint(b)
    assert sorted(a) == sorted(b)
    for key in a:
        if key != "meta/wall_s":  # a measured time, the one thing a resumed run cannot repeat
            np.testing.assert_array_equal(a[key], b[key], err_msg=key, strict=True)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mid_epoch", [False, True], ids=["epoch_end", "mid_epoch"])
def test_a_stopped_and_resumed_run_ends_bitwise_where_an_uninterrupted_one_does(tmp_path, monkeypatch, case,
                                                                                 mid_epoch):
    """Stopped after the case's stop_epoch (default 1), or 2 steps into the next epoch."""
    stop_epoch = CASES[case].get("stop_epoch", 1)
    stop_after = stop_epoch * STEPS_PER_EPOCH + (2 if mid_epoch else 0)
    dataset = synthetic_dataset()
    whole = new_run(tmp_path, "whole", config_for(case))
    expected = train(build_session(config_for(case), CpuBackend(), dataset), whole)

    stopped = new_run(tmp_path, "stopped", config_for(case))
    with monkeypatch.context() as patch:
        stop = StopAfterSteps(patch, stop_after)
        with pytest.raises(TrainingInterrupted) as info:
            train(build_session(config_for(case), CpuBackend(), dataset), stopped, stop=stop)
    assert info.value.exit_code == 130
    # counted as the progress line counts: the epoch's own steps, then the run's in all
    where = f"at epoch {stop_epoch + 1}, after step 2 of its {STEPS_PER_EPOCH}" if mid_epoch else \
        f"after epoch {stop_epoch}"
    assert f"interrupted {where} ({stop_after} optimizer steps in all)" in str(info.value)
    assert f"--resume {stopped}" in str(info.value)
    saved = load_checkpoint(stopped / "checkpoints" / "last.npz")
    assert (int(saved["meta/epoch"]), int(saved["meta/window"])) == (stop_epoch, 2 if mid_epoch else 0)

    config, resume = prepare_resume(stopped, [])
    resumed = train(build_session(config, CpuBackend(), dataset), stopped, resume=resume)
    assert_same_checkpoint(stopped / "checkpoints" / "last.npz", whole / "checkpoints" / "last.npz")
    if "plateau" in case:  # so the plateau's state mattered
        assert load_checkpoint(whole / "checkpoints" / "last.npz")["plateau/multiplier"] < 1
    if "fp16" in case:  # so the loss scale, its growth tracker and the skipped count mattered
        assert 0 < expected["skipped_steps"] and expected["loss_scale"] != 2.0**30
    assert_same_checkpoint(stopped / "checkpoints" / "best.npz", whole / "checkpoints" / "best.npz")
    for key in ("test_acc", "val_acc", "optimizer_steps", "skipped_steps", "loss_scale", "epochs", "best_epoch",
                "stopped_early"):
        assert resumed[key] == expected[key], key
    if "early_stopping" in case:  # so the counter mattered
        assert expected["stopped_early"] and (expected["epochs"], expected["best_epoch"]) == (6, 4)
    np.testing.assert_array_equal(np.load(stopped / "grad_norms.npy"), np.load(whole / "grad_norms.npy"), strict=True)
    assert resumed["resumed"] and not expected["resumed"]
    assert resumed["wall_s_total"] > resumed["wall_s"]  # the part before the stop counts too
    epochs = [line for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert epochs == (whole / "metrics.jsonl").read_text().splitlines()  # appended, each epoch once


def test_extending_train_epochs_continues_a_finished_run(tmp_path):
    """A constant schedule does not depend on the run's length: 2 epochs then 2 more equal 4."""
    dataset = synthetic_dataset()
    whole = new_run(tmp_path, "whole", make_config(64, 4, epochs=4))
    train(build_session(make_config(64, 4, epochs=4), CpuBackend(), dataset), whole)
    short = new_run(tmp_path, "short", make_config(64, 4, epochs=2))
    train(build_session(make_config(64, 4, epochs=2), CpuBackend(), dataset), short)
    with pytest.raises(UserError, match="already trained 2 epochs"):
        prepare_resume(short, [])
    config, resume = prepare_resume(short, ["train.epochs=4"])
    summary = train(build_session(config, CpuBackend(), dataset), short, resume=resume)
    assert summary["optimizer_steps"] == 4 * STEPS_PER_EPOCH and len(np.load(short / "grad_norms.npy")) == 16
    assert_same_checkpoint(short / "checkpoints" / "last.npz", whole / "checkpoints" / "last.npz")
    assert "epochs: 4" in (short / "config.yaml").read_text()


@pytest.mark.parametrize("override", ["optim.lr=0.1", "seed=1", "model.hidden=[8]", "train.batch_size=32"])
def test_resume_refuses_any_change_but_more_epochs(tmp_path, override):
    run_dir = new_run(tmp_path, "run", make_config(64, 4))
    with pytest.raises(UserError, match=f"override '{override.split('=')[0]}'.*only train.epochs"):
        prepare_resume(run_dir, [override])


def test_resume_needs_a_run_with_a_checkpoint(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        prepare_resume(tmp_path / "absent", [])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.yaml"):
        prepare_resume(tmp_path / "empty", [])
    run_dir = new_run(tmp_path, "run", make_config(64, 4))
    with pytest.raises(UserError, match="no checkpoints/last.npz"):
        prepare_resume(run_dir, [])
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        prepare_resume(run_dir, [])


def test_a_checkpoint_of_another_model_is_one_clear_error(tmp_path):
    dataset = synthetic_dataset()
    run_dir = new_run(tmp_path, "run", make_config(64, 4, epochs=1))
    train(build_session(make_config(64, 4, epochs=1), CpuBackend(), dataset), run_dir)
    other = config_to_dict(make_config(64, 4, epochs=2))
    other["model"]["hidden"] = [16, 8]
    write_yaml(run_dir / "config.yaml", other)
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(UserError) as info:  # the checkpoint records the config it was trained with
        prepare_resume(run_dir, [])
    message = str(info.value)
    assert "model.hidden ([16, 12] -> [16, 8])" in message and "\n" not in message
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing written


def test_load_host_dict_checks_names_and_shapes():
    buffer = FlatBuffer(CpuBackend(), Layout(("w", "b"), ((2, 3), (3,))))
    good = {"p/w": np.ones((2, 3)), "p/b": np.zeros(3)}
    buffer.load_host_dict(good, prefix="p/")
    assert buffer.backend.to_host(buffer.flat).tolist() == [1.0] * 6 + [0.0] * 3
    for bad, fragment in [({"p/w": good["p/w"]}, "missing p/b"), ({**good, "p/x": np.ones(1)}, "unexpected p/x"),
                          ({**good, "p/b": np.zeros(4)}, "p/b has shape (4,), the model's is (3,)")]:
        with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            buffer.load_host_dict(bad, prefix="p/")


def test_plateau_state_round_trips():
    config = make_config(64, 4, schedule={"name": "plateau", "patience": 1}).schedule
    plateau = Plateau(config, 0.1)
    for value in (1.0, 0.9, 0.95, 0.97, 0.99):
        plateau.observe(value)
    copy = Plateau(config, 0.1)
    copy.load_state_dict(plateau.state_dict())
    assert (copy.best, copy.bad_evaluations, copy.multiplier) == (plateau.best, plateau.bad_evaluations,
                                                                  plateau.multiplier)
    assert copy.observe(0.5) == plateau.observe(0.5)
    fresh = Plateau(config, 0.1)
    fresh.load_state_dict(Plateau(config, 0.1).state_dict())
    assert fresh.best is None
    with pytest.raises(UserError, match="plateau/multiplier"):
        fresh.load_state_dict({"plateau/best": np.nan, "plateau/bad_evaluations": np.array(0)})


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_a_diverging_run_names_the_step_and_keeps_its_last_good_checkpoint(tmp_path):
    """SGD whose lr jumps from 0.05 to 5e5 after epoch 1 (a step schedule with gamma 1e7)."""
    config = make_config(64, 4, {"name": "sgd", "lr": 0.05}, {"name": "step", "step_size": 1, "gamma": 1e7},
                         epochs=3)
    run_dir = new_run(tmp_path, "run", config)
    with pytest.raises(TrainingDiverged) as info:
        train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir)
    message = str(info.value)
    # the schedule's gamma made the lr 5e5, not optim.lr: the message blames the setting that did it
    assert "optimizer step" in message and "schedule.gamma=1e+07 multiplies the learning rate" in message
    last = load_checkpoint(run_dir / "checkpoints" / "last.npz")
    assert int(last["meta/epoch"]) == 1
    assert all(np.isfinite(v).all() for k, v in last.items() if k.startswith("params/"))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_an_interrupt_after_divergence_does_not_checkpoint_nan_parameters(tmp_path, monkeypatch):
    """The stop lands between a diverged step and the next metric read: the parameters are checked."""
    config = make_config(64, 4, {"name": "sgd", "lr": 1e6}, epochs=2, log_every=1000)
    run_dir = new_run(tmp_path, "run", config)
    with pytest.raises(TrainingDiverged, match="non-finite by optimizer step 3"):
        train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir,
              stop=StopAfterSteps(monkeypatch, 3))
    assert not (run_dir / "checkpoints" / "last.npz").exists()


def test_stop_on_signal_records_the_first_signal_and_exits_on_the_second(monkeypatch):
    import os

    import mlptrain.cli.signals as interrupt

    def fake_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(interrupt.os, "_exit", fake_exit)
    previous = signal.getsignal(signal.SIGINT)
    with interrupt.StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT  # recorded, nothing raised: the step in flight finishes
        with pytest.raises(SystemExit) as info:
            os.kill(os.getpid(), signal.SIGINT)
        assert info.value.code == 130
    assert signal.getsignal(signal.SIGINT) is previous
