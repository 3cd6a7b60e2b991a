"""A trained run loaded back: its config and checkpoint (best or last), its model with the checkpoint's
parameters, sized to fit the memory free now. evaluate, predict, export and extract-features stand on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlptrain.config.load import RESOLVED, load_config, read_yaml
from mlptrain.config.schema import Config
from mlptrain.data import recorded_dataset
from mlptrain.errors import UserError
from mlptrain.nn import make_model, model_dataset
from mlptrain.run_dirs.links import check_no_links
from mlptrain.training.checkpoint import load_checkpoint
from mlptrain.training.experiment import check_same_dataset
from mlptrain.training.fallbacks import warn
from mlptrain.training.memory_plan import check_model_fits
from mlptrain.training.resume import check_same_config
from mlptrain.util.npz_archive import open_npz

CHECKPOINTS = ("best", "last")
EDITED = "the run's commands read it as it was trained: restore config.yaml as the run wrote it"


def load_run(run_dir: Path, checkpoint: str) -> tuple[Config, Path]:
    """The run's config and the path of its `checkpoint` (best or last); raises UserError."""
    if checkpoint not in CHECKPOINTS:
        raise UserError(f"--checkpoint {checkpoint}: use best or last")
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    check_no_links(run_dir)  # a config.yaml or checkpoint linked from elsewhere would be reported as this run's
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: no config.yaml, so not a run directory")
    config = load_config(run_dir / "config.yaml")
    path = run_dir / "checkpoints" / f"{checkpoint}.npz"
    if not path.is_file():
        others = [name for name in CHECKPOINTS if (run_dir / "checkpoints" / f"{name}.npz").is_file()]
        hint = f"use --checkpoint {others[0]}" if others else "the run stopped before its first checkpoint"
        raise UserError(f"{run_dir}: no checkpoints/{checkpoint}.npz ({hint})")
    recorded = recorded_config(path)
    if recorded is not None:  # edited since: a seed or data.val_size changed would evaluate another split
        check_same_config(path, recorded, config, str(run_dir), EDITED)
    return config, path


def recorded_config(path: Path) -> dict | None:
    """{"meta/config": the config checkpoint `path` recorded} (that array alone, as check_same_config reads
    it); None for a checkpoint from before runs recorded it, read as it is. A damaged file is refused here in
    the words the checkpoint loader uses (mlptrain.util.npz_archive)."""
    with open_npz(path, "checkpoint") as arrays:
        return {"meta/config": arrays["meta/config"]} if "meta/config" in arrays.files else None


def check_run_data(run_dir: Path, config: Config, dataset) -> None:
    """The run's own data (its config.yaml's) is the data it trained on, by the checksum it recorded."""
    check_same_dataset(run_dir, config, dataset, str(run_dir), "its results there would not be the run's; give "
                       "the data it trained on, or name other data with --data (evaluate)")


def load_fitting_model(config: Config, path: Path, backend, dataset, rows: int, flag: str):
    """(the model with checkpoint `path`'s parameters, holding up to `rows` images at a time; the dataset as
    it reads it, mlptrain.nn.model_dataset). A batch beyond the larger part is never filled (a run may have
    trained with train.eval_batch_size=1e9), and what remains must fit before anything is allocated (`flag`
    names the setting to lower). Raises UserError."""
    fed = model_dataset(config, dataset)
    available = max(len(fed.train_images), len(fed.test_images))
    rows = min(rows, available) if available else rows  # none: the run's record stands in (recorded_inputs)
    check_model_fits(config, backend, fed, rows, flag)
    return load_model(config, path, backend, fed, rows), fed


def recorded_inputs(run_dir: Path):
    """The dataset the run recorded in its config.yaml, without its images (mlptrain.data.recorded_dataset):
    enough to read new images as the model read its own; None for a run that recorded no inputs."""
    raw = read_yaml(run_dir / "config.yaml")
    resolved = raw.get(RESOLVED) if isinstance(raw, dict) else None
    record = resolved.get("dataset") if isinstance(resolved, dict) else None
    return recorded_dataset(record) if isinstance(record, dict) else None


def warn_fallbacks(backend, dataset) -> None:
    """One warning line for each thing the backend or the dataset cache fell back from."""
    for note in [*backend.fallbacks, dataset.provenance.read_note, dataset.provenance.cache_note]:
        if note:
            warn(note)


def load_model(config: Config, path: Path, backend, dataset, rows: int):
    """The run's model, holding `rows` images at a time, with the parameters of checkpoint `path`; raises
    UserError when they do not fit the config."""
    arrays = load_checkpoint(path)
    model = make_model(config, backend, dataset, rows)
    try:
        model.load_parameters(arrays, prefix="params/")  # also fills the fp16 / bf16 compute copy
    except UserError as err:
        raise UserError(f"{path}: {err}; was the config.yaml beside it changed?") from None
    return model


def checkpoint_origin(run_dir: Path, checkpoint: str) -> dict:
    """Which epoch the run's `checkpoint` holds and why: {"epoch", "selected_by", "value"} (the validation
    metric that picks `best`, and that epoch's value of it) from the checkpoint's own meta/ scalars; {} for a
    checkpoint without them. Reads only those scalars."""
    try:
        with open_npz(run_dir / "checkpoints" / f"{checkpoint}.npz", "checkpoint") as arrays:
            epoch = int(arrays["meta/epoch"]) if "meta/epoch" in arrays.files else None
            best_epoch = int(arrays["meta/best_epoch"]) if "meta/best_epoch" in arrays.files else None
            metrics = [k for k in arrays.files if k.startswith("meta/best_") and k != "meta/best_epoch"]
            value = float(arrays[metrics[0]]) if metrics else None
    except UserError:  # absent, damaged, or no scalar where one belongs (int(NaN): open_npz refuses it too)
        return {}
    if epoch is None:
        return {}
    origin = {"epoch": epoch}
    if metrics and best_epoch == epoch and value is not None and np.isfinite(value):
        origin.update(selected_by=metrics[0].removeprefix("meta/best_"), value=value)
    return origin


def describe_origin(checkpoint: str, origin: dict) -> str:
    """`best checkpoint: epoch 7, best val_acc 0.9871`, or `last checkpoint: epoch 10`."""
    if not origin:
        return f"{checkpoint} checkpoint"
    why = f", best {origin['selected_by']} {origin['value']:.4g}" if "selected_by" in origin else ""
    return f"{checkpoint} checkpoint: epoch {origin['epoch']}{why}"
