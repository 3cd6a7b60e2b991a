"""train.eval_test: when a run evaluates its test split (early stopping's case:
tests/training/test_early_stopping.py)."""

import json
import re

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mlptrain.backends.cpu import CpuBackend
from mlptrain.training.loop import train
from mlptrain.training.resume import prepare_resume
from mlptrain.training.session import build_session
from mlptrain.util.console import console
from tests.training.test_accumulation import make_config, synthetic_dataset
from tests.training.test_resume import new_run


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_with_test_metrics(run_dir):
    events = EventAccumulator(str(run_dir)).Reload()
    if "accuracy/test" not in events.Tags()["scalars"]:
        return []
    return [event.step for event in events.Scalars("accuracy/test")]


def test_by_default_the_test_split_is_evaluated_once_at_the_end(tmp_path):
    config = make_config(64, 1, epochs=3)
    assert config.train.eval_test == "end"
    run = new_run(tmp_path, "run", config)
    with console.capture() as printed:
        summary = train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    logged = records(run)
    assert [sorted(k for k in r if k.startswith("test_")) for r in logged] == [[], [], ["test_acc", "test_loss"]]
    assert all("val_acc" in r for r in logged)
    assert summary["test_acc"] == logged[-1]["test_acc"]
    assert steps_with_test_metrics(run) == [logged[-1]["step"]]
    lines = [line for line in printed.get().splitlines() if re.match(r"epoch \d+: ", line)]
    assert len(lines) == 3
    assert "test" not in lines[0] and "| test loss" in lines[-1]


def test_every_epoch_tests_every_epoch_and_trains_the_same(tmp_path):
    end, every = make_config(64, 1, epochs=3), make_config(64, 1, epochs=3, eval_test="every_epoch")
    summaries = {}
    for name, config in (("end", end), ("every", every)):
        run = new_run(tmp_path, name, config)
        summaries[name] = train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    logged = records(tmp_path / "every")
    assert all("test_acc" in r and "test_loss" in r for r in logged) and len(logged) == 3
    assert steps_with_test_metrics(tmp_path / "every") == [r["step"] for r in logged]
    for key in ("test_acc", "test_loss", "val_acc", "val_loss", "train_loss"):
        assert summaries["end"][key] == summaries["every"][key], key  # evaluation changes nothing it trains


def test_resuming_may_change_when_the_test_split_is_evaluated(tmp_path):
    config = make_config(64, 1, epochs=2)
    run = new_run(tmp_path, "run", config)
    train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    written = yaml.safe_load((run / "config.yaml").read_text())
    written["train"]["eval_test"] = "every_epoch"  # config.yaml may differ in what does not change training
    (run / "config.yaml").write_text(yaml.safe_dump(written))
    config, resume = prepare_resume(run, ["train.epochs=4"])
    summary = train(build_session(config, CpuBackend(), synthetic_dataset()), run, resume=resume)
    assert ["test_acc" in r for r in records(run)] == [False, True, True, True] and summary["epochs"] == 4


@pytest.mark.parametrize("value", ["sometimes", "", 1])
def test_a_bad_value_is_refused(value):
    with pytest.raises(Exception, match="train.eval_test"):
        make_config(64, 1, eval_test=value)
