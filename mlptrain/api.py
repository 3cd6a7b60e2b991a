"""mlptrain from Python (a notebook, another tool), on the same code paths as the CLI:

    from mlptrain.api import load, train

    run = train("adam_mnist", ["train.epochs=1", "backend=cpu"])  # a built-in name, a YAML file or a dict
    run.summary["test_acc"], run.run_dir                           # summary.json, and where the run is
    model = load(run.run_dir)                                      # its best checkpoint, on the CPU
    model.predict(images)                                          # class probabilities, or reconstructions

`train` is `mlptrain run`: the config checked, the data and model built (every refusal a `UserError`
before anything is written), a run folder made and trained in. `load` is what `mlptrain predict` loads:
the run folder alone is enough, no dataset is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.cli.configs import resolve_config
from mlptrain.config.load import config_from_mapping, load_config
from mlptrain.inference.image_files import image_rows
from mlptrain.inference.model import TrainedModel, load_trained, softmax
from mlptrain.run_dirs.folders import check_run_name
from mlptrain.run_dirs.lock import release_run
from mlptrain.training.experiment import Resources, create_run
from mlptrain.training.loop import train as train_session
from mlptrain.training.session import build_session


@dataclass(frozen=True)
class Run:
    """A finished run: its folder and its summary.json."""

    run_dir: Path
    summary: dict


def train(config, overrides: list[str] = (), runs_dir: str | Path = "runs", name: str | None = None) -> Run:
    """Train `config` with `overrides` (KEY=VALUE strings, as on the command line) in a new folder of
    `runs_dir` (named `name`, default <config>-<timestamp>). `config` is a built-in config's name, a YAML
    file, or a dict of sections (its `base:` found relative to the working directory). Raises UserError."""
    if isinstance(config, dict):
        cfg, stem = config_from_mapping(config, list(overrides)), "config"
    else:
        path = resolve_config(str(config))
        cfg, stem = load_config(path, list(overrides)), path.stem
    if name is not None:
        check_run_name(name)
    session = build_session(cfg, *Resources().prepare(cfg, start_compilers=True))  # before anything is written
    run_dir = create_run(cfg, Path(runs_dir), name, stem, dataset=session.dataset, backend=session.backend.name)
    try:
        return Run(run_dir, train_session(session, run_dir))
    finally:
        release_run(run_dir)  # the CLI's process lets it go at its exit; here the caller's process goes on


class Model:
    """A trained run's model, loaded from one of its checkpoints."""

    def __init__(self, trained: TrainedModel):
        self.trained = trained

    @property
    def class_names(self) -> list[str]:
        return self.trained.class_names

    @property
    def image_shape(self) -> tuple[int, ...]:
        """The shape of one input: (C, H, W) for images, (D,) for features."""
        return self.trained.image_shape

    def outputs(self, images: np.ndarray) -> np.ndarray:
        """The model's outputs for `images` ((N, C, H, W), (N, H, W, C), (N, H, W) for grey, or (N, D); pixels
        0..255 as the dataset stores them): logits (N, classes), or reconstructions (N, C, H, W) in pixels / 255."""
        rows = image_rows(np.asarray(images), self.image_shape, self.trained.dataset.train_images.dtype,
                          Path("images"))
        return self.trained.images(rows)

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Class probabilities (N, classes) for a classifier, reconstructions for the autoencoder."""
        outputs = self.outputs(images)
        return softmax(outputs) if self.trained.classifies else outputs


def load(run_dir: str | Path, checkpoint: str = "best", backend: str = "cpu", batch_size: int | None = None) -> Model:
    """The model of the run in `run_dir` with its `checkpoint` (best or last), on `backend` (cpu, cuda or
    auto), holding `batch_size` images at a time (default: the run's train.eval_batch_size). The run folder
    alone is enough: no dataset is read. Raises UserError."""
    return Model(load_trained(Path(run_dir), checkpoint, backend, batch_size, images=False))
