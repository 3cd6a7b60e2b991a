"""Experiment configs: typed sections, YAML loading, `key=value` overrides, validation.

Every section is a frozen dataclass; every field may carry `choices` or a
`check` in its metadata. All errors are `UserError`s naming the file and the
dotted key, and an unknown key suggests the closest valid one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlptrain.config.rules import MODEL_KEYS, check_combinations, check_model_keys
from mlptrain.config.safe_yaml import brief, brief_text, load_yaml_text
from mlptrain.config.safe_yaml import read_yaml as read_yaml_file
from mlptrain.config.suggestions import suggest_key, suggest_value
from mlptrain.errors import UserError

INT64_MAX = 2**63 - 1  # checkpoints store counters as int64; TensorBoard's HParams take nothing larger
INDEX_MAX = 2**31 - 1  # a batch's rows and a layer's width index kernel grids and int32 offsets


def _positive(value):
    return None if value > 0 else "must be > 0"


def _between(low, high):
    def check(value):
        return None if low <= value <= high else f"must be in [{low:,}, {high:,}]"
    return check


def _count(maximum):
    """A whole number in [1, maximum]."""
    return _between(1, maximum)


def _non_negative(value):
    return None if value >= 0 else "must be >= 0"


def _unit_interval(value):
    return None if 0 <= value < 1 else "must be in [0, 1)"


def _widths(value):
    return None if all(1 <= w <= INDEX_MAX for w in value) else f"every layer width must be in [1, {INDEX_MAX:,}]"


def _channels(value):
    return None if len(value) >= 1 and all(1 <= c <= INDEX_MAX for c in value) else \
        f"needs at least one width, each in [1, {INDEX_MAX:,}]"


def _betas(value):
    return None if len(value) == 2 and all(0 <= b < 1 for b in value) else "must be two numbers in [0, 1)"


def _option(default, *, choices=None, check=None, doc=""):
    return field(default=default, metadata={"choices": choices, "check": check, "doc": doc})


@dataclass(frozen=True)
class DataConfig:
    # the built-in table of mlptrain.data.registry, then the formats a user brings
    dataset: str = _option("mnist", choices=("mnist", "fashion_mnist", "kmnist", "cifar10", "cifar100", "npz",
                                              "folder"))
    root: str | None = _option(None, doc="dataset folder; default $MLPTRAIN_DATA_DIR, else the user cache")
    val_size: int = _option(5000, check=_non_negative, doc="images held out of the training set (unless the "
                                                           "dataset has its own validation split)")
    path: str | None = _option(None, doc="npz: the .npz file; folder: the folder holding train/ and test/")
    label: str | None = _option(None, choices=("fine", "coarse"), doc="cifar100: fine (100 classes, the default) "
                                                                      "or coarse (20 superclasses)")


WEIGHT_SCHEMES = ("pytorch", "he_uniform", "he_normal", "glorot_uniform")  # formulas: mlptrain.nn.init
BIAS_SCHEMES = ("pytorch", "zeros")
# the default weights per model type, chosen from the measurements in README.md ("Initialisation")
DEFAULT_WEIGHTS = {"mlp": "pytorch", "conv_autoencoder": "pytorch"}


@dataclass(frozen=True)
class InitConfig:
    """Initial parameters; null is the default: the model type's weights (DEFAULT_WEIGHTS) and the biases
    that go with the weights (PyTorch's with its weights, zeros with the others, as He et al. and Glorot
    and Bengio use them)."""

    weights: str | None = _option(None, choices=WEIGHT_SCHEMES, doc="every layer's weights")
    biases: str | None = _option(None, choices=BIAS_SCHEMES,
                                 doc="pytorch: U(+-1/sqrt(fan_in)); default pytorch with pytorch weights, else zeros")


@dataclass(frozen=True)
class ModelConfig:
    type: str = _option("mlp", choices=("mlp", "conv_autoencoder"))
    hidden: tuple[int, ...] = _option((512, 512), check=_widths, doc="mlp: hidden layer widths")
    activation: str = _option("relu", choices=("relu", "tanh", "sigmoid"), doc="mlp: hidden activation")
    channels: tuple[int, ...] = _option((256, 128), check=_channels,
                                        doc="conv_autoencoder: encoder conv widths, each followed by a 2x2 max-pool; "
                                            "the decoder mirrors them")
    kernel_size: int = _option(3, choices=(1, 3, 5), doc="conv_autoencoder: square kernels, stride 1, 'same' padding")
    init: InitConfig = field(default_factory=InitConfig)


@dataclass(frozen=True)
class OptimConfig:
    name: str = _option("adam", choices=("sgd", "momentum", "adam", "adamw"))
    lr: float = _option(1e-3, check=_positive)
    momentum: float = _option(0.9, check=_unit_interval)
    nesterov: bool = _option(False)
    betas: tuple[float, float] = _option((0.9, 0.999), check=_betas)
    eps: float = _option(1e-8, check=_positive)
    weight_decay: float = _option(0.0, check=_non_negative)


def _above_one(value):
    return None if value >= 1 else "must be >= 1"


def _fraction(value):
    return None if 0 < value < 1 else "must be in (0, 1)"


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = _option("constant", choices=("constant", "cosine", "warmup_cosine", "warmup_linear", "step",
                                             "inverse_sqrt", "plateau"))
    min_lr: float = _option(0.0, check=_non_negative, doc="the floor of decaying schedules")
    warmup_steps: int = _option(0, check=_non_negative, doc="linear warmup, in optimizer steps")
    warmup_epochs: float = _option(0.0, check=_between(0, INDEX_MAX), doc="linear warmup, in epochs (or warmup_steps)")
    step_size: int = _option(5, check=_positive, doc="step: epochs between decays")
    gamma: float = _option(0.1, check=_positive, doc="step: the decay factor")
    d_model: int = _option(512, check=_positive, doc="inverse_sqrt: the model width in the Transformer formula")
    factor: float = _option(0.1, check=_fraction, doc="plateau: lr multiplier after `patience` bad evaluations")
    patience: int = _option(2, check=_non_negative, doc="plateau: evaluations without improvement tolerated")
    metric: str = _option("val_loss", choices=("val_loss", "val_acc"),
                          doc="plateau: the validation metric watched (loss: lower is better, acc: higher)")


@dataclass(frozen=True)
class LossScaleConfig:
    """fp16's dynamic loss scaling; the defaults are PyTorch GradScaler's."""

    init: float = _option(65536.0, check=_positive)
    growth_factor: float = _option(2.0, check=_above_one)
    backoff_factor: float = _option(0.5, check=_fraction)
    growth_interval: int = _option(2000, check=_positive, doc="finite steps in a row before the scale grows")


@dataclass(frozen=True)
class EarlyStoppingConfig:
    """Stop when the validation metric has not improved for `patience` evaluations; off while patience is
    null. Its metric also picks the `best` checkpoint."""

    metric: str = _option("val_loss", choices=("val_loss", "val_acc", "val_mse"),
                          doc="val_loss (the autoencoder's is val_mse), val_acc (classifiers)")
    patience: int | None = _option(None, check=_positive, doc="evaluations without improvement before stopping")
    min_delta: float = _option(0.0, check=_non_negative, doc="an improvement must beat the best by more than this")
    restore_best: bool = _option(True, doc="end with the best epoch's parameters (checkpoints/best.npz)")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _option(10, check=_count(INT64_MAX))
    batch_size: int = _option(128, check=_count(INDEX_MAX))
    eval_batch_size: int = _option(1000, check=_count(INDEX_MAX))
    log_every: int = _option(50, check=_positive, doc="steps between metric reads (the only host syncs)")
    checkpoint_every_epochs: int = _option(1, check=_positive)
    precision: str = _option("fp32", choices=("fp32", "fp16", "bf16"),
                             doc="fp16/bf16: mixed precision with fp32 master weights and gradients")
    grad_accum_steps: int = _option(1, check=_count(INDEX_MAX), doc="micro-batches of batch_size per optimizer step")
    clip_grad_norm: float | None = _option(None, check=_positive, doc="clip the global gradient norm to this")
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    cuda_graphs: bool = _option(True, doc="cuda: replay each full window's launches as one CUDA graph "
                                          "(bitwise the same results, far less launch overhead)")
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.grad_accum_steps


@dataclass(frozen=True)
class Config:
    description: str = _option("")
    backend: str = _option("auto", choices=("auto", "cuda", "cpu"))
    seed: int = _option(0, check=_between(0, INT64_MAX))
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def valid_keys(cls=Config, prefix="") -> list[str]:
    """Every dotted key of the schema, e.g. `optim.lr`."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += valid_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def valid_sections(cls=Config, prefix="") -> list[str]:
    """Every dotted section of the schema, e.g. `train.early_stopping`."""
    sections = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            sections += [prefix + f.name, *valid_sections(hints[f.name], f"{prefix}{f.name}.")]
    return sections


def _unknown_key(source, dotted):
    dotted = str(dotted)
    close = suggest_key(dotted, valid_keys()) if len(dotted) < 100 else None
    hint = f"; did you mean '{close}'?" if close else f"; valid keys: {', '.join(valid_keys())}"
    return UserError(f"{source}: unknown key {brief(dotted)}{hint}")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


def _convert(value, tp, where):
    """Coerce a YAML value to the annotated type, or raise UserError."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        inner = [t for t in options if t is not type(None)][0]
        return _convert(value, inner, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {brief(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise UserError(f"{where}: expected a list of {len(args)} values, got {len(value)}")
        return tuple(_convert(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, args)))
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, float) and value.is_integer():  # YAML 1.2 reads `1e3` as a float
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > INT64_MAX:
                raise UserError(f"{where}: {brief(value)} is beyond any setting (at most 2**63 - 1)")
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise UserError(f"{where}: must be a finite number, got {brief(value)}")
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
            try:
                return _convert(float(value), float, where)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise UserError(f"{where}: expected {_type_name(tp)}, got {brief(value)}")


def _build(cls, raw, source, prefix=""):
    if not isinstance(raw, dict):
        where = prefix.rstrip(".") or "the config"
        keys = f" (its keys: {', '.join(f.name for f in dataclasses.fields(cls))})" if prefix else ""
        raise UserError(f"{source}: {where} must be a mapping of keys to values{keys}, got {brief(raw)}")
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            raise _unknown_key(source, f"{prefix}{key}")
    values = {}
    for name, value in raw.items():
        f, dotted, tp = names[name], f"{prefix}{name}", hints[name]
        if dataclasses.is_dataclass(tp):
            values[name] = _build(tp, value if value is not None else {}, source, dotted + ".")
            continue
        values[name] = _field_value(f, tp, value, f"{source}: {dotted}")
    return cls(**values)


def _field_value(f, tp, value, where: str):
    """`value` converted to the field's type and checked against its choices and check; raises UserError
    starting with `where`."""
    value = _convert(value, tp, where)
    choices, check = f.metadata.get("choices"), f.metadata.get("check")
    if choices and value is not None and value not in choices:
        close = suggest_value(str(value), list(map(str, choices))) if len(str(value)) < 100 else None
        hint = f"; did you mean '{close}'?" if close else ""
        raise UserError(f"{where}: {brief(value)} is not one of {', '.join(map(str, choices))}{hint}")
    problem = check(value) if check and value is not None else None
    if problem:
        raise UserError(f"{where}: {problem} (got {brief(value)})")
    return value


def check_override_values(overrides: list[str]) -> list[tuple[str, Any]]:
    """Each `KEY=VALUE` checked on its own, so that a bad value is blamed on the command line (`override
    optim.lr=fast: expected float, got 'fast'`), not on the config file it lands in; returns each one's
    (dotted key, value) as `parse_override` reads it."""
    parsed = []
    for text in overrides:
        dotted, value = parse_override(text)
        parsed.append((dotted, value))
        if isinstance(value, dict) and dotted in valid_sections():  # a section given whole: each of its keys
            check_override_values([f"{dotted}.{key}={json.dumps(inner)}" for key, inner in value.items()])
            continue
        if dotted in valid_sections():  # `model.init=pytorch`: a section given a plain value
            keys = [k for k in valid_keys() if k.rpartition(".")[0] == dotted]
            raise UserError(f"override {brief_text(text)}: {dotted} is a section; set one of its keys "
                            f"({', '.join(keys)})")
        if dotted not in valid_keys():
            raise _unknown_key("override", dotted)
        cls = Config
        *parents, leaf = dotted.split(".")
        for part in parents:
            cls = typing.get_type_hints(cls)[part]
        f = {f.name: f for f in dataclasses.fields(cls)}[leaf]
        where = f"override {dotted}={brief_text(text.partition('=')[2].strip())}"
        _field_value(f, typing.get_type_hints(cls)[leaf], value, where)
    return parsed


def parse_override(text: str) -> tuple[str, Any]:
    """`optim.lr=3e-4` -> ("optim.lr", 0.0003); the value is read as YAML (mlptrain.config.safe_yaml)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override '{brief_text(text)}': expected KEY=VALUE, e.g. optim.lr=3e-4")
    return key.strip(), load_yaml_text(value, f"override '{brief_text(text)}'") if value.strip() else None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Set dotted keys in a nested dict, creating sections as needed."""
    return _set_values(raw, (parse_override(text) for text in overrides))


def _set_values(raw: dict, values) -> dict:
    """`raw` with each (dotted key, value) of `values` set (`apply_overrides` once they are parsed)."""
    raw = dict(raw)
    for dotted, value in values:
        if dotted not in valid_keys() and not (isinstance(value, dict) and dotted in valid_sections()):
            raise _unknown_key("override", dotted)
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        # a section given whole (`train.early_stopping={patience: 3}`) adds to what the file set there
        node[leaf] = {**node[leaf], **value} if isinstance(value, dict) and isinstance(node.get(leaf), dict) else value
    return raw


def read_yaml(path: Path):
    """A config or sweep file's YAML (bounded, YAML 1.2 numbers, duplicate keys refused: mlptrain.config.safe_yaml)."""
    if not path.exists():
        raise UserError(f"{path}: no such config file (see `mlptrain configs` for the built-in ones)")
    raw = read_yaml_file(path)
    return {} if raw is None else raw


RESOLVED = "resolved"  # the section of a run's config.yaml that records what the run actually used


def load_config(path: Path, overrides: list[str] = ()) -> Config:
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a config must be a mapping of sections, got {type(raw).__name__}")
    raw.pop(RESOLVED, None)  # a run's record of what it used: informative, never read back
    parsed = check_override_values(list(overrides))  # each override's YAML read once, here
    source = f"{path} with the overrides" if overrides else str(path)
    config = config_from_dict(_set_values(raw, parsed), source=source)
    check_model_keys(config.model.type, dict(parsed), "override")
    return config


def config_from_dict(raw: dict, source: str = "config") -> Config:
    config = _build(Config, raw, source)
    check_combinations(config, source)
    return _fill_defaults(config)


def init_scheme(model: ModelConfig) -> tuple[str, str]:
    """(weights, biases) of `model.init`, its defaults filled in."""
    weights = model.init.weights or DEFAULT_WEIGHTS[model.type]
    return weights, model.init.biases or ("pytorch" if weights == "pytorch" else "zeros")


def _fill_defaults(config: Config) -> Config:
    """Defaults that depend on other keys, made explicit so that config.yaml records what a run used."""
    weights, biases = init_scheme(config.model)
    init = dataclasses.replace(config.model.init, weights=weights, biases=biases)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, init=init))


def config_to_dict(config: Config) -> dict:
    """Plain YAML-ready values (tuples become lists)."""

    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


def steps_per_epoch(train_size: int, train_config) -> int:
    """Optimizer steps (windows) per epoch of `train_size` samples: ceil(micro-batches / grad_accum_steps)."""
    micro_batches = -(-train_size // train_config.batch_size)
    return -(-micro_batches // train_config.grad_accum_steps)


def resolved_dict(config: Config, backend: str | None = None, data_root: str | None = None) -> dict:
    """`config_to_dict` as a run records it: `backend` and `data_root` (when given) in place of `auto` and
    the default folder, and only the keys of the config's own model type."""
    values = config_to_dict(config)
    if backend is not None:
        values["backend"] = backend
    if data_root is not None and values["data"].get("root") is None:
        values["data"]["root"] = str(data_root)
    others = {key for keys in MODEL_KEYS.values() for key in keys} - set(MODEL_KEYS[config.model.type])
    values["model"] = {key: value for key, value in values["model"].items() if key not in others}
    return values
