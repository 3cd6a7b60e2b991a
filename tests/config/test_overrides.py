"""Command-line overrides: a bad value is blamed on the command line, an unknown key gets the key meant,
a section can be given whole; early stopping's rules; the config a run records (resolved)."""

import pytest

from mlptrain.config.load import config_from_dict, load_config, resolved_dict
from mlptrain.config.schema import valid_keys
from mlptrain.config.suggestions import suggest_key
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


@pytest.mark.parametrize("raw, fragment", [
    # no validation: every record's metric was NaN, which never improves, so the rate was cut on nothing
    ({"data": {"val_size": 0}, "schedule": {"name": "plateau"}}, "'plateau' reads the validation metric"),
    # 1e308 ** 2 overflowed Python's float inside the schedule: an OverflowError traceback at the first step
    ({"schedule": {"name": "step", "gamma": 1e308, "step_size": 1}}, "past float32's range"),
    ({"schedule": {"name": "step", "gamma": 10.0, "step_size": 1}, "train": {"epochs": 100}}, "over 99 decays"),
])
def test_schedules_refuse_what_they_cannot_do(raw, fragment):
    with pytest.raises(UserError, match=fragment):
        config_from_dict(raw)
    config_from_dict({**raw, "schedule": {"name": "constant"}})  # the same keys otherwise are fine
    config_from_dict({"schedule": {"name": "step", "gamma": 10.0, "step_size": 1}, "train": {"epochs": 4}})


def test_the_resolved_record_holds_what_ran_and_only_its_model_type():
    mlp = config_from_dict({"model": {"type": "mlp", "hidden": [16]}})
    record = resolved_dict(mlp, backend="cpu", data_root="/data")
    assert record["backend"] == "cpu" and record["data"]["root"] == "/data"
    assert set(record["model"]) == {"type", "hidden", "activation", "init"}
    autoencoder = resolved_dict(config_from_dict({"model": {"type": "conv_autoencoder"}, "data": {"root": "/x"}}),
                                data_root="/data")
    assert set(autoencoder["model"]) == {"type", "channels", "kernel_size", "init"} and autoencoder["data"]["root"] == "/x"
    assert config_from_dict(record) == config_from_dict({**record, "backend": "cpu"})  # a run reads it back


@pytest.mark.parametrize("model_type, key, value", [
    (kind, key, value) for kind, other in (("mlp", "conv_autoencoder"), ("conv_autoencoder", "mlp"))
    for key, value in {"hidden": "[4]", "activation": "tanh", "channels": "[4]", "kernel_size": "5"}.items()
    if key in __import__("mlptrain.config.rules").config.rules.MODEL_KEYS[other]])
@pytest.mark.parametrize("form", ["dotted", "section"])
def test_an_override_the_model_type_does_not_read_is_refused(tmp_path, model_type, key, value, form):
    """An override that would change nothing (a key of the other model type) is refused, not ignored; given
    together with model.type, the same key counts."""
    from mlptrain.config.rules import MODEL_KEYS

    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{type: {model_type}}}\n")
    override = f"model.{key}={value}" if form == "dotted" else f"model={{{key}: {value}}}"
    owner = next(kind for kind, keys in MODEL_KEYS.items() if key in keys)
    with pytest.raises(UserError, match=f"override: model.{key} is read only by model.type {owner}, and this "
                                        f"config's is {model_type}; drop it, or set model.type={owner}"):
        load_config(path, [override])
    config = load_config(path, [f"model.type={owner}", override])
    assert str(getattr(config.model, key)).replace("(", "[").replace(",)", "]") == value


def test_a_sweep_parameter_no_model_reads_is_refused_but_a_mixed_sweep_passes(tmp_path):
    from mlptrain.sweep.spec import load_sweep

    (tmp_path / "base.yaml").write_text("model: {type: mlp}\n")
    (tmp_path / "s.yaml").write_text("base: base.yaml\nmetric: test_loss\nparameters: {model.channels: [[4], [8]]}\n")
    with pytest.raises(UserError, match="s.yaml: parameters: model.channels is read only by model.type "
                                        "conv_autoencoder"):
        load_sweep(tmp_path / "s.yaml", [])
    (tmp_path / "s.yaml").write_text("base: base.yaml\nmetric: test_loss\nparameters: {model.type: [mlp, "
                                     "conv_autoencoder], model.channels: [[4], [8]], data.dataset: [cifar10]}\n")
    assert load_sweep(tmp_path / "s.yaml", []).trials == 4
    load_sweep(tmp_path / "s.yaml", ["model.kernel_size=5"])  # AE trials'
    (tmp_path / "s.yaml").write_text("base: base.yaml\nmetric: test_loss\nparameters: {optim.lr: [0.1, 0.2]}\n")
    with pytest.raises(UserError, match="override: model.kernel_size is read only by model.type conv_autoencoder"):
        load_sweep(tmp_path / "s.yaml", ["model.kernel_size=5"])
