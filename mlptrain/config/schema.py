"""The config schema: one frozen dataclass per section, and the facts derived from it alone.

Every field may carry `choices` or a `check` in its metadata, which load.py applies as it builds a
config from YAML and overrides; the rules that span several keys are in rules.py.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field

INT64_MAX = 2**63 - 1  # checkpoints store counters as int64; TensorBoard's HParams take nothing larger
MAX_IMAGE_SIDE = 8192  # data.image_size: larger is no small model's input
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


def _count_or_fraction(value):
    if isinstance(value, int):
        return None if value >= 0 else "must be a count >= 0 or a fraction in (0, 1)"
    return None if 0 < value < 1 else "must be a count >= 0 or a fraction in (0, 1) (a count is a whole number)"


def _image_sides(value):
    return None if value is None or all(1 <= side <= MAX_IMAGE_SIDE for side in value) else \
        f"must be [height, width], each in [1, {MAX_IMAGE_SIDE:,}]"


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
    val_size: int | float = _option(0.1, check=_count_or_fraction,
                                    doc="training images held out for validation: a count (5000), or a fraction of "
                                        "them (0.1) (unless the dataset has its own validation split)")
    path: str | None = _option(None, doc="npz: the .npz file; folder: the folder holding train/ and test/")
    label: str | None = _option(None, choices=("fine", "coarse"), doc="cifar100: fine (100 classes, the default) "
                                                                      "or coarse (20 superclasses)")
    image_size: tuple[int, int] | None = _option(
        None, check=_image_sides, doc="folder: [height, width] every image is resized to (Pillow's bilinear "
                                      "filter, antialiased when shrinking); unset: every image must have the first's size")


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
    eval_test: str = _option("end", choices=("end", "every_epoch"),
                             doc="end: the test split once, on the parameters the run ends with (as Keras and "
                                 "Lightning do); every_epoch: after every epoch's validation too")
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


def _mlflow_uri(value):
    return None if value is None or value.strip() else "must be a tracking URI (a server, a database) or null"


def _experiment_name(value):
    return None if value is None or value.strip() else "must be an experiment's name or null"


@dataclass(frozen=True)
class LoggingConfig:
    """Where a run logs besides TensorBoard and metrics.jsonl (which it always writes): not a hyperparameter."""

    mlflow: bool = _option(False, doc="also log the params, metrics and artefacts to MLflow (pip install "
                                      "'mlptrain[mlflow]')")
    mlflow_uri: str | None = _option(None, check=_mlflow_uri,
                                     doc="MLflow tracking URI; default $MLFLOW_TRACKING_URI, else "
                                         "sqlite:///RUNS/mlflow.db; artefacts in RUNS/mlruns/ unless a server keeps them")
    mlflow_experiment: str | None = _option(None, check=_experiment_name,
                                            doc="MLflow experiment; default the runs folder's name (a sweep's "
                                                "trials: the sweep's)")


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
    logging: LoggingConfig = field(default_factory=LoggingConfig)


@functools.cache
def type_hints(cls) -> dict:
    """`typing.get_type_hints` of a schema class, evaluated once: the annotations are strings (postponed), and
    evaluating them took ~3 ms of each packed trial's config checks (benchmarks/NOTES.md, issue 30 step 20).
    The dict is shared: read it, do not change it."""
    return typing.get_type_hints(cls)


def valid_keys(cls=Config, prefix="") -> list[str]:
    """Every dotted key of the schema, e.g. `optim.lr`."""
    keys = []
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += valid_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def valid_sections(cls=Config, prefix="") -> list[str]:
    """Every dotted section of the schema, e.g. `train.early_stopping`."""
    sections = []
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            sections += [prefix + f.name, *valid_sections(hints[f.name], f"{prefix}{f.name}.")]
    return sections


def init_scheme(model: ModelConfig) -> tuple[str, str]:
    """(weights, biases) of `model.init`, its defaults filled in."""
    weights = model.init.weights or DEFAULT_WEIGHTS[model.type]
    return weights, model.init.biases or ("pytorch" if weights == "pytorch" else "zeros")


def steps_per_epoch(train_size: int, train_config) -> int:
    """Optimizer steps (windows) per epoch of `train_size` samples: ceil(micro-batches / grad_accum_steps)."""
    micro_batches = -(-train_size // train_config.batch_size)
    return -(-micro_batches // train_config.grad_accum_steps)

