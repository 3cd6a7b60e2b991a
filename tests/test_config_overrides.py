"""Command-line overrides: a bad value is blamed on the command line, an unknown key gets the key meant,
a section can be given whole; early stopping's rules; the config a run records (resolved)."""

import pytest

from mlptrain.config import config_from_dict, load_config, resolved_dict, valid_keys
from mlptrain.config_keys import suggest_key
from mlptrain.errors import UserError


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("optim: {name: adam, lr: 0.01}\n")
    return path


@pytest.mark.parametrize("override, message", [
    ("optim.lr=fast", "override optim.lr=fast: expected float, got 'fast'"),
    ("optim.lr=-1", "override optim.lr=-1: must be > 0 (got -1.0)"),
    ("backend=gpu", "override backend=gpu: 'gpu' is not one of auto, cuda, cpu; did you mean 'cuda'?"),
    ("data.dataset=mnits", "override data.dataset=mnits: 'mnits' is not one of mnist, fashion_mnist, kmnist, cifar10, "
                           "cifar100, npz, folder; did you mean 'mnist'?"),
    ("train.early_stopping={patience: 0}", "override train.early_stopping.patience=0: must be > 0 (got 0)"),
])
def test_a_bad_value_names_the_command_line_not_the_file(config_file, override, message):
    with pytest.raises(UserError) as info:
        load_config(config_file, [override])
    assert str(info.value) == message and "mine.yaml" not in str(info.value)


@pytest.mark.parametrize("typed, meant", [
    ("optim.learning_rate", "optim.lr"), ("learning_rate", "optim.lr"), ("train.learning_rate", "optim.lr"),
    ("lr", "optim.lr"), ("train.batch", "train.batch_size"), ("batch_size", "train.batch_size"),
    ("epochs", "train.epochs"), ("train.epoch", "train.epochs"), ("optim.lrr", "optim.lr"),
    ("model.hiden", "model.hidden"), ("optim.wd", "optim.weight_decay"), ("patience", "schedule.patience"),
    ("train.early_stopping.patiense", "train.early_stopping.patience"), ("optimizer", "optim.name"),
])
def test_an_unknown_key_suggests_the_key_meant(config_file, typed, meant):
    assert suggest_key(typed, valid_keys()) == meant
    with pytest.raises(UserError, match=f"unknown key '{typed}'; did you mean '{meant}'"):
        load_config(config_file, [f"{typed}=1"])


def test_a_section_given_whole_adds_to_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train: {early_stopping: {metric: val_acc}}\n")
    config = load_config(path, ["train.early_stopping={patience: 3, min_delta: 0.01}"])
    assert (config.train.early_stopping.metric, config.train.early_stopping.patience) == ("val_acc", 3)
    assert config.train.early_stopping.min_delta == 0.01


def test_a_combination_broken_by_overrides_says_so(config_file):
    with pytest.raises(UserError, match="mine.yaml with the overrides: schedule.name 'cosine' has no warmup"):
        load_config(config_file, ["schedule.name=cosine", "schedule.warmup_steps=3"])


@pytest.mark.parametrize("raw, fragment", [
    ({"model": {"type": "conv_autoencoder"}, "train": {"early_stopping": {"patience": 2, "metric": "val_acc"}}},
     "a conv_autoencoder reports no val_acc"),
    ({"train": {"early_stopping": {"patience": 2, "metric": "val_mse"}}}, "a mlp reports no val_mse"),
    ({"data": {"val_size": 0}, "train": {"early_stopping": {"patience": 2}}}, "data.val_size is 0"),
])
def test_early_stopping_refuses_what_it_cannot_watch(raw, fragment):
    with pytest.raises(UserError, match=fragment):
        config_from_dict(raw)
    off = {**raw, "train": {"early_stopping": {**raw["train"]["early_stopping"], "patience": None}}}
    config_from_dict(off)  # off, the same keys are harmless


def test_the_resolved_record_holds_what_ran_and_only_its_model_type():
    mlp = config_from_dict({"model": {"type": "mlp", "hidden": [16]}})
    record = resolved_dict(mlp, backend="cpu", data_root="/data")
    assert record["backend"] == "cpu" and record["data"]["root"] == "/data"
    assert set(record["model"]) == {"type", "hidden", "activation", "init"}
    autoencoder = resolved_dict(config_from_dict({"model": {"type": "conv_autoencoder"}, "data": {"root": "/x"}}),
                                data_root="/data")
    assert set(autoencoder["model"]) == {"type", "channels", "kernel_size", "init"} and autoencoder["data"]["root"] == "/x"
    assert config_from_dict(record) == config_from_dict({**record, "backend": "cpu"})  # a run reads it back
