"""A trained run's model outside training: loaded from one of its checkpoints (on the CPU backend unless
asked otherwise) and fed images exactly as training feeds them (the gather kernel's normalisation, the
model's own forward pass and loss). `mlptrain evaluate`, `predict` and `export` stand on it.

Images come in the dataset's own layout (`ImageDataset.image_shape`: (C, H, W) planes for MNIST and
CIFAR-10, flattened to rows of D values) and outputs leave in it: the autoencoder works in NHWC inside,
so its inputs and reconstructions are permuted here, at the edge.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.backends.selection import get_backend
from mlptrain.config.load import apply_overrides, config_from_dict, config_to_dict
from mlptrain.config.schema import Config
from mlptrain.data.loader import ResidentSplit, resident_splits, whole_split
from mlptrain.dtypes import to_float32
from mlptrain.errors import UserError
from mlptrain.inference.loading import check_run_data, load_fitting_model, load_run, recorded_inputs, warn_fallbacks
from mlptrain.nn import input_scale_shift
from mlptrain.training.experiment import Resources

SPLITS = ("test", "val", "train")


@dataclass
class TrainedModel:
    run_dir: Path
    config: Config
    checkpoint: str  # best or last
    backend: object
    dataset: object  # as loaded: the dataset's own layout, class names
    model: object  # holding `model.max_rows` images at a time
    scale: float  # pixel -> pixel * scale + shift, the model's input (mlptrain.nn.input_scale_shift)
    shift: float

    @property
    def classifies(self) -> bool:
        return self.model.task == "classification"

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.dataset.image_shape)

    @property
    def class_names(self) -> list[str]:
        """The dataset's class names where it has them, else the class indices as text."""
        names = getattr(self.dataset, "class_names", None) or ()
        return [str(n) for n in names] if len(names) == self.dataset.num_classes else \
            [str(k) for k in range(self.dataset.num_classes)]

    def split(self, name: str) -> ResidentSplit:
        """`test`, or the run's own `val` / `train` rows (its seed and data.val_size hold them out)."""
        if name not in SPLITS:
            raise UserError(f"--split {name}: use {', '.join(SPLITS)}")
        if name == "test":
            return whole_split(self.backend, self.model_rows(self.dataset.test_images), self.dataset.test_labels)
        if not len(self.dataset.train_images):
            raise UserError(f"--split {name}: {self.dataset.provenance.location or self.dataset.name} holds test data "
                            "alone (no x_train, y_train); use --split test")
        own_val = self.dataset.val_images  # a dataset's own validation split: the model's layout too
        images = dataclasses.replace(self.dataset, train_images=self.model_rows(self.dataset.train_images),
                                     val_images=None if own_val is None else self.model_rows(own_val))
        train, val, _ = resident_splits(images, self.backend, self.config.data.val_size, self.config.seed)
        if name == "val" and not val.size:
            raise UserError(f"--split val: the run held out no validation images (data.val_size "
                            f"{self.config.data.val_size}); use --split test or train")
        return train if name == "train" else val

    def model_rows(self, images: np.ndarray) -> np.ndarray:
        """Rows in the dataset's layout -> rows in the model's (NHWC for the autoencoder)."""
        if self.classifies:
            return images
        c, h, w = self.image_shape
        return np.ascontiguousarray(images.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(len(images), -1))

    def dataset_rows(self, values: np.ndarray) -> np.ndarray:
        """Reconstructions in the model's layout -> the dataset's, shaped (N, *image_shape)."""
        c, h, w = self.image_shape
        return np.ascontiguousarray(values.reshape(-1, h, w, c).transpose(0, 3, 1, 2))

    def run(self, split: ResidentSplit, on_batch=None) -> tuple[np.ndarray, np.ndarray]:
        """(outputs, per-sample loss) over every row of `split`: logits (N, classes), or reconstructions
        (N, *image_shape) in pixels / 255, float32; the loss is the training loss (cross-entropy or the
        reconstruction MSE) computed by the same kernel."""
        rows_max, backend, model = self.model.max_rows, self.backend, self.model
        row_loss, row_correct = backend.empty((max(split.size, 1),)), backend.empty((max(split.size, 1),), np.int32)
        unit_scale = backend.to_device(np.ones(1, np.float64))  # loss scale 1: the gradient is discarded
        out = np.empty((split.size, self.output_width), np.float32)  # each batch copied in once, no concatenation
        gather = backend.kernels.data.gather_batch
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite output is refused below, in one line
            for start in range(0, split.size, rows_max):
                rows = min(rows_max, split.size - start)
                x, labels = model.batch(rows)
                gather(split.images, split.labels, split.device_index, start, x, labels, self.scale, self.shift)
                y = self.forward(rows)
                model.loss(rows, row_loss, row_correct, start, 0.0, unit_scale)
                out[start:start + rows] = to_float32(backend.to_host(y)).reshape(rows, -1)
                if on_batch is not None:
                    on_batch(rows)
        loss = backend.to_host(row_loss)[:split.size].astype(np.float64)
        if not (np.isfinite(out).all() and np.isfinite(loss).all()):
            raise UserError(f"{self.run_dir}: the {self.checkpoint} checkpoint's model gives NaN or infinite outputs "
                            f"(parameters up to {self.largest_parameter():.3g}); the checkpoint is damaged or its "
                            "run diverged: use another checkpoint or run")
        if not self.classifies:
            out = self.dataset_rows(out)
        return out, loss

    def largest_parameter(self) -> float:
        return max((float(np.abs(v).max()) for v in self.parameters().values() if v.size), default=0.0)

    def forward(self, rows: int):
        """The model's output for the gathered batch: logits, or the reconstruction (model layout)."""
        logits = self.model.forward(rows)
        return logits if self.classifies else self.model.reconstruction(rows)

    @property
    def output_width(self) -> int:
        return self.dataset.num_classes if self.classifies else int(np.prod(self.image_shape))

    def images(self, pixels: np.ndarray, on_batch=None) -> np.ndarray:
        """Outputs (as `run`) for `pixels`, rows in the dataset's layout and storage type."""
        labels = np.zeros(len(pixels), np.uint8)
        return self.run(whole_split(self.backend, self.model_rows(pixels), labels), on_batch)[0]

    def parameters(self) -> dict[str, np.ndarray]:
        """The float32 master weights by name (`fc1.weight` (in, out), `conv1.weight` (k, k, in, out), ...)."""
        return self.model.params.to_host_dict()


def load_trained(run_dir: Path, checkpoint: str = "best", backend: str = "cpu", batch_size: int | None = None,
                 data: str | None = None, precision: str | None = None, images: bool = True) -> TrainedModel:
    """The run's model with the parameters of its `checkpoint`, on `backend`, holding `batch_size` images at
    once (default: the run's train.eval_batch_size); `data` names another dataset of the same shape to feed
    it (see `with_data`), `precision` replaces the run's (fp32 reads the master weights as they are).
    Without `images` (predict, export) the dataset is not read: the run's record of it stands in (its
    shape, classes and normalisation; `dataset` then holds no images), so a run folder alone is enough. A
    run that recorded none reads its dataset. Raises UserError, every refusal before the dataset is read."""
    config, path = load_run(run_dir, checkpoint)
    trained_config = config
    if data is not None:
        config = with_data(config, data)
    if precision is not None:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision))
    rows = batch_size or config.train.eval_batch_size
    config = dataclasses.replace(config, backend=backend)
    resources = Resources()
    # the run's record of its data: enough without images, and for other data the model's own inputs
    recorded = recorded_inputs(run_dir) if not images or data is not None else None
    if recorded is not None and data is None:
        device, dataset = get_backend(backend), recorded
    else:
        device, dataset = resources.prepare(config)
        if data is None:
            check_run_data(run_dir, trained_config, dataset)
    if data is not None:
        trained_on = recorded or resources.dataset(trained_config)  # the run's record: its data need not be here
        check_same_shape(dataset, trained_on, data)
        # the model keeps the outputs it was trained with; the other dataset's labels index the first ones
        names = dataset.class_names
        names = names + tuple(str(k) for k in range(len(names), trained_on.num_classes)) if names else ()
        dataset = dataclasses.replace(dataset, num_classes=trained_on.num_classes, class_names=names)
        if recorded is not None:  # fed as the model was trained: the run's normalisation, not this data's own
            dataset = dataclasses.replace(dataset, mean=recorded.mean, std=recorded.std,
                                          value_scale=recorded.value_scale)
    model, _ = load_fitting_model(config, path, device, dataset, rows,
                                  "--batch-size" if batch_size else "train.eval_batch_size")
    warn_fallbacks(device, dataset)  # after every refusal: an error stays one line
    scale, shift = input_scale_shift(model, dataset)
    return TrainedModel(run_dir, config, checkpoint, device, dataset, model, scale, shift)


def with_data(config: Config, data: str) -> Config:
    """The run's config reading another dataset: `data` is a dataset name (`--data fashion_mnist`) or
    KEY=VALUE pairs of the data section separated by commas (`--data dataset=npz,path=my.npz`)."""
    pairs = [part.strip() for part in data.split(",") if part.strip()]
    if not pairs:
        raise UserError("--data: give a dataset name or data-section KEY=VALUE pairs, e.g. --data dataset=mnist")
    if "=" not in pairs[0]:
        pairs[0] = f"dataset={pairs[0]}"
    overrides = [f"data.{pair}" for pair in pairs]
    try:
        return config_from_dict(apply_overrides(config_to_dict(config), overrides), source="--data")
    except UserError as err:
        raise UserError(str(err).replace("override: ", "--data: ")) from None


def check_same_shape(dataset, trained_on, data: str) -> None:
    """A model trained on `trained_on` can read `dataset`: the same image shape and, for the classes a
    classifier names, no more classes than it has outputs."""
    shape, trained_shape = tuple(dataset.image_shape), tuple(trained_on.image_shape)
    if shape != trained_shape or dataset.train_images.dtype != trained_on.train_images.dtype:
        raise UserError(f"--data {data}: {dataset.name} images are {shape} {dataset.train_images.dtype}, the run "
                        f"was trained on {trained_on.name} images of {trained_shape} {trained_on.train_images.dtype}")
    if dataset.num_classes > trained_on.num_classes:
        raise UserError(f"--data {data}: {dataset.name} has {dataset.num_classes} classes, the run's model "
                        f"{trained_on.num_classes}")


def softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities of each row of logits, computed in float64, returned as float32."""
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
