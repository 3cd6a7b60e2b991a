"""Models as static graphs over preallocated buffers, and the factory that builds one from a config."""

from __future__ import annotations

import dataclasses

import numpy as np

from mlptrain.errors import UserError
from mlptrain.nn.autoencoder import ConvAutoencoder
from mlptrain.nn.mlp import MLP

__all__ = ["ConvAutoencoder", "MLP", "check_model_input", "check_trainable_labels", "make_model", "model_dataset"]


def check_model_input(model_config, dataset) -> None:
    """Raise `UserError` (one line) when the model of `model_config` cannot take the dataset's samples:
    the MLP takes any flat size; the autoencoder needs pixel images whose sides its 2x2 pools divide."""
    if model_config.type != "conv_autoencoder":
        return
    if len(dataset.image_shape) != 3 or dataset.train_images.dtype != np.uint8:
        raise UserError(f"model.type conv_autoencoder needs images (uint8 pixels, C x H x W); {dataset.name} holds "
                        f"{dataset.train_images.dtype} samples of shape {dataset.image_shape}: use model.type mlp")
    _, h, w = dataset.image_shape
    stages = len(model_config.channels)
    if h % 2 ** stages or w % 2 ** stages:
        fits = next(k for k in range(stages, -1, -1) if h % 2 ** k == 0 and w % 2 ** k == 0)
        hint = (f"give model.channels at most {fits} widths" if fits else
                "an odd side cannot be pooled: crop or pad the images to even sides")
        raise UserError(f"model.channels: {stages} conv + max-pool stages need image sides divisible by "
                        f"{2 ** stages}; {dataset.name} images are {h}x{w}: {hint}")


def check_trainable_labels(model_config, dataset) -> None:
    """Raise `UserError` when a classifier would train on a single class (the loss is 0 from the first
    step and an accuracy of 1 means nothing); evaluating on one class is fine, so training alone checks."""
    if model_config.type == "conv_autoencoder":
        return
    labels = np.asarray(dataset.train_labels).ravel()
    # a comparison with the first label, not np.unique: that sorts, and its first call imports numpy.ma
    # (40-75 ms of a run's start on a GPU host)
    if not labels.size or (labels == labels[0]).all():
        where = getattr(getattr(dataset, "provenance", None), "location", "") or dataset.name
        raise UserError(f"{where}: every training label is {int(labels[0]) if labels.size else '-'}; a "
                        f"classifier (model.type {model_config.type}) needs at least two classes "
                        "(model.type conv_autoencoder needs no labels)")


def model_dataset(config, dataset):
    """The dataset as the model reads it: images as stored for an MLP; for the autoencoder, NHWC
    (its convolutions' layout), permuted once on the host from the CHW planes datasets keep."""
    if config.model.type != "conv_autoencoder":
        return dataset
    check_model_input(config.model, dataset)
    c, h, w = dataset.image_shape

    def hwc(images):
        if images is None:
            return None
        # the width named: a run's recorded dataset stands in with no rows, and -1 cannot be inferred from 0
        return np.ascontiguousarray(images.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(len(images), c * h * w))

    return dataclasses.replace(dataset, train_images=hwc(dataset.train_images), test_images=hwc(dataset.test_images),
                               val_images=hwc(dataset.val_images), image_shape=(h, w, c))


def make_model(config, backend, dataset, max_rows: int):
    """The model of `config.model` for a dataset already passed through `model_dataset`."""
    m, precision = config.model, config.train.precision
    if m.type == "mlp":
        return MLP(backend, dataset.num_features, list(m.hidden), dataset.num_classes, m.activation, max_rows,
                   precision)
    return ConvAutoencoder(backend, dataset.image_shape, list(m.channels), m.kernel_size, max_rows, precision)


def input_scale_shift(model, dataset) -> tuple[float, float]:
    """value -> model input as one multiply-add: standardised values for a classifier, pixels / 255 for
    the autoencoder (which reconstructs them)."""
    if model.task == "classification":
        return 1.0 / (dataset.value_scale * dataset.std), -dataset.mean / dataset.std
    return 1.0 / dataset.value_scale, 0.0
