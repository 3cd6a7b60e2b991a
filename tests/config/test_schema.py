import dataclasses

import pytest

from mlptrain.config.load import apply_overrides, config_from_dict, config_to_dict, load_config
from mlptrain.config.schema import Config, InitConfig, init_scheme, valid_keys
from mlptrain.errors import UserError


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_round_trip():
    config, plain = config_from_dict({}), Config()
    # model.init's defaults depend on the model type: loading fills them in, the dataclass leaves them null
    assert config.model.init == InitConfig(*init_scheme(plain.model))
    assert dataclasses.replace(config, model=plain.model) == plain
    assert config_from_dict(config_to_dict(config)) == config


def test_overrides_are_yaml_typed(tmp_path):
    path = write(tmp_path, "optim: {name: adam, lr: 0.01}\n")
    config = load_config(path, ["optim.lr=3e-4", "model.hidden=[256,128]", "backend=cpu", "train.epochs=1",
                                "data.root=null"])
    assert config.optim.lr == pytest.approx(3e-4)
    assert config.model.hidden == (256, 128)
    assert config.backend == "cpu" and config.train.epochs == 1 and config.data.root is None


def test_yaml_scientific_without_dot_is_a_float(tmp_path):
    assert load_config(write(tmp_path, "optim: {lr: 1e-3}\n")).optim.lr == pytest.approx(1e-3)


@pytest.mark.parametrize("text, fragment", [
    ("optim: {lrr: 0.1}\n", "did you mean 'optim.lr'"),
    ("optimizer: {lr: 0.1}\n", "unknown key 'optimizer'"),
    ("optim: {lr: -1}\n", "optim.lr: must be > 0"),
    ("optim: {lr: 0}\n", "optim.lr: must be > 0"),
    ("optim: {lr: fast}\n", "optim.lr: expected float"),
    ("optim: {name: adagrad}\n", "optim.name: 'adagrad' is not one of sgd, momentum, adam, adamw"),
    ("optim: {betas: [0.9]}\n", "optim.betas: expected a list of 2 values"),
    ("optim: {betas: [0.9, 1.5]}\n", "optim.betas"),
    ("train: {epochs: 2.5}\n", "train.epochs: expected int"),
    ("train: {epochs: true}\n", "train.epochs: expected int"),
    ("train: {batch_size: 0}\n", "train.batch_size: must be in [1,"),
    ("model: {hidden: [512, 0]}\n", "model.hidden"),
    ("model: {hidden: 512}\n", "model.hidden: expected a list"),
    ("backend: tpu\n", "backend: 'tpu' is not one of auto, cuda, cpu"),
    ("train: 5\n", "train must be a mapping"),
    ("[1, 2]\n", "must be a mapping"),
    ("optim: {lr: .nan}\n", "finite"),
    ("optim: [\n", "not valid YAML"),
])
def test_bad_configs_fail_with_one_clear_line(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        load_config(path)
    message = str(info.value)
    assert fragment in message and "\n" not in message and str(path) in message


@pytest.mark.parametrize("override, fragment", [
    ("optim.lrr=0.1", "did you mean 'optim.lr'"),
    ("optim.lr", "expected KEY=VALUE"),
    ("=3", "expected KEY=VALUE"),
    ("optim.lr=[", "not valid YAML"),
    ("optim.lr=-3", "must be > 0"),
])
def test_bad_overrides(tmp_path, override, fragment):
    with pytest.raises(UserError, match=fragment.replace("[", r"\[")):
        load_config(write(tmp_path, ""), [override])


def test_missing_file_names_it(tmp_path):
    with pytest.raises(UserError, match="no such config file"):
        load_config(tmp_path / "absent.yaml")


def test_override_creates_sections():
    assert apply_overrides({}, ["train.epochs=3"]) == {"train": {"epochs": 3}}


def test_valid_keys_are_dotted():
    keys = valid_keys()
    assert "optim.lr" in keys and "train.batch_size" in keys and "seed" in keys


def test_builtin_configs_validate():
    from mlptrain.config.builtins import builtin_configs

    names = builtin_configs()
    assert {"sgd_mnist", "momentum_mnist", "adam_mnist", "adamw_mnist"} <= set(names)
    for path in names.values():
        load_config(path)


# Property: whatever a user writes, the config either validates or raises one clear UserError line.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SECTIONS = {key.split(".")[0] for key in valid_keys() if "." in key}
FIELDS = sorted({key.split(".")[-1] for key in valid_keys()}) + ["lrr", "epoch", "", "1", "optimizer"]
SCALARS = (st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from(["adam", "sgd", "plateau", "fp16", "bf16", "cpu", "cuda", "relu", "1e-3", "", "nan",
                              "mnist", "val_acc", "warmup_cosine", "inverse_sqrt"])
           | st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3), max_leaves=6)
SECTION = st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=5)
RAW = st.dictionaries(st.sampled_from(sorted(SECTIONS) + ["seed", "backend", "description", "optimiser", "x"]),
                      SECTION | VALUES, max_size=5)


def validates_or_refuses(build):
    try:
        return build()
    except UserError as err:
        assert "\n" not in str(err) and str(err)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(RAW)
def test_random_configs_validate_or_raise_user_error(raw):
    config = validates_or_refuses(lambda: config_from_dict(raw, source="random"))
    if config is not None:
        assert config_from_dict(config_to_dict(config)) == config


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.tuples(st.sampled_from(valid_keys() + ["optim.lrr", "train", "a.b.c", ""]),
                          st.sampled_from(["", "=", "=1", "=-1", "=0", "=2.5", "=[1,2]", "=[", "=null", "=true",
                                           "=adam", "=fp16", "=.inf", "={a: 1}", "=1e-3", "=[0.9, 0.99]"])),
                max_size=4))
def test_random_overrides_validate_or_raise_user_error(tmp_path_factory, overrides):
    path = tmp_path_factory.mktemp("c") / "c.yaml"
    path.write_text("optim: {name: adam}\n")
    validates_or_refuses(lambda: load_config(path, [key + value for key, value in overrides]))


def test_every_mistake_of_a_config_and_of_the_overrides_is_named_in_one_line(tmp_path):
    """A config fixed one mistake per run took as many runs as it had mistakes."""
    from mlptrain.config.load import check_override_values, load_config

    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  lrr: 0.1\n  name: adamm\ntrain:\n  epochs: -1\n  batch_size: x\n")
    with pytest.raises(UserError) as err:
        load_config(path, [])
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: 4 problems: unknown key 'optim.lrr'")
    for fragment in ("optim.name: 'adamm' is not one of", "train.epochs: must be in", "train.batch_size: expected int"):
        assert fragment in message
    with pytest.raises(UserError) as err:
        check_override_values(["optim.lrr=1", "train.epochs=0", "model.activation=relux", "optim.lr=0.1"])
    assert str(err.value).startswith("3 problems in the overrides: override: unknown key 'optim.lrr'")
    assert "model.activation=relux: 'relux' is not one of" in str(err.value)
    with pytest.raises(UserError, match=r"^override train.epochs=0: must be in"):  # one alone: as it was
        check_override_values(["train.epochs=0"])
