"""The rules of a config that span more than one key (config.py checks each key on its own): data.path with
the user datasets, warmup with the schedules that have one, early stopping and the plateau schedule with a
validation split (and early stopping with the model's metrics), step decay with the run's length."""

from __future__ import annotations

from mlptrain.errors import UserError

WARMUP_SCHEDULES = ("warmup_cosine", "warmup_linear", "inverse_sqrt")


def check_combinations(config, source: str) -> None:
    """Rules that involve more than one key."""
    check_data(config.data, source)
    schedule = config.schedule
    if schedule.warmup_steps and schedule.warmup_epochs:
        raise UserError(f"{source}: schedule.warmup_steps and schedule.warmup_epochs are alternatives; set one")
    warmup = schedule.warmup_steps or schedule.warmup_epochs
    if warmup and schedule.name not in WARMUP_SCHEDULES:
        raise UserError(f"{source}: schedule.name '{schedule.name}' has no warmup; use one of "
                        f"{', '.join(WARMUP_SCHEDULES)} or drop schedule.warmup_steps/warmup_epochs")
    if schedule.name == "inverse_sqrt" and not warmup:
        raise UserError(f"{source}: schedule.name 'inverse_sqrt' needs schedule.warmup_steps (e.g. 4000) "
                        f"or schedule.warmup_epochs")
    if config.data.dataset not in USER_DATASETS:  # a built-in dataset has no validation split of its own
        check_validation(config, source, has_val_split=False)
    check_step_decay(config, source)
    check_early_stopping(config, source)


FLOAT32_MAX = 3.4028234663852886e38


def check_step_decay(config, source: str) -> None:
    """`step` multiplies the rate by gamma every step_size epochs: a gamma above 1 can take it past float32
    (a 1e308 gamma overflowed Python's float at the second decay: an OverflowError traceback)."""
    schedule = config.schedule
    if schedule.name != "step" or schedule.gamma <= 1:
        return
    decays = (config.train.epochs - 1) // schedule.step_size
    try:
        final = config.optim.lr * schedule.gamma ** decays
    except OverflowError:
        final = float("inf")
    if not final <= FLOAT32_MAX:
        raise UserError(f"{source}: schedule.gamma {schedule.gamma:g} over {decays:,} decays takes the learning rate "
                        f"past float32's range ({FLOAT32_MAX:.3g}); step decays with a gamma below 1")


def check_early_stopping(config, source: str) -> None:
    stopping = config.train.early_stopping
    if stopping.patience is None:
        return
    wrong = {"mlp": "val_mse", "conv_autoencoder": "val_acc"}[config.model.type]
    if stopping.metric == wrong:
        valid = "val_loss or val_acc" if config.model.type == "mlp" else "val_loss (its val_mse) or val_mse"
        raise UserError(f"{source}: train.early_stopping.metric: a {config.model.type} reports no {wrong}; use {valid}")


def check_validation(config, source: str, has_val_split: bool) -> None:
    """Early stopping and the plateau schedule read the validation metric: without validation images every
    record's metric is NaN, which never improves (the plateau rate was cut each `patience + 1` epochs on
    nothing, without a word). A dataset with its own validation split (an npz's x_val, a folder's val/) has
    them whatever data.val_size says, so the user datasets are checked again once loaded."""
    if has_val_split or config.data.val_size != 0:
        return
    if config.train.early_stopping.patience is not None:
        raise UserError(f"{source}: train.early_stopping watches the validation metric, and data.val_size is 0; "
                        "hold out validation images or drop train.early_stopping.patience")
    if config.schedule.name == "plateau":
        raise UserError(f"{source}: schedule.name 'plateau' reads the validation metric, and data.val_size is 0; "
                        "hold out validation images or use another schedule")


USER_DATASETS = {"npz": "the .npz file, e.g. data.path=my.npz",
                 "folder": "the folder holding train/<class>/*.png and test/<class>/*.png"}


def check_data(data, source: str) -> None:
    if data.dataset in USER_DATASETS and data.path is None:
        raise UserError(f"{source}: data.dataset {data.dataset} needs data.path: {USER_DATASETS[data.dataset]}")
    if data.dataset not in USER_DATASETS and data.path is not None:
        raise UserError(f"{source}: data.path is for data.dataset npz or folder; {data.dataset} is read from "
                        f"data.root (or $MLPTRAIN_DATA_DIR): drop data.path")
    if data.image_size is not None and data.dataset != "folder":
        raise UserError(f"{source}: data.image_size resizes the images of data.dataset folder; {data.dataset} has "
                        "its own size: drop data.image_size")
    if data.label is not None and data.dataset != "cifar100":
        raise UserError(f"{source}: data.label chooses CIFAR-100's fine or coarse labels; {data.dataset} has one "
                        f"set of labels: drop data.label")


# the model keys each model type reads; a run's record leaves out the other type's
MODEL_KEYS = {"mlp": ("hidden", "activation"), "conv_autoencoder": ("channels", "kernel_size")}


def check_model_keys(model_type: str, given: dict, source: str) -> None:
    """Refuse an override (dotted key -> value) of a key the config's model type does not read: it would
    change nothing, silently. A config file may carry both types' keys; what a user adds must count."""
    for dotted, value in given.items():
        leaves = [dotted.partition(".")[2]] if dotted.startswith("model.") else \
            list(value) if dotted == "model" and isinstance(value, dict) else []
        for leaf in leaves:
            owner = next((kind for kind, keys in MODEL_KEYS.items() if leaf in keys), model_type)
            if owner != model_type:
                raise UserError(f"{source}: model.{leaf} is read only by model.type {owner}, and this config's "
                                f"is {model_type}; drop it, or set model.type={owner}")
