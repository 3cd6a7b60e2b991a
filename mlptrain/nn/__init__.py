"""Models as static graphs over preallocated buffers, and the factory that builds one from a config."""

from __future__ import annotations

import dataclasses

import numpy as np

from mlptrain.errors import UserError
from mlptrain.nn.autoencoder import ConvAutoencoder
from mlptrain.nn.mlp import MLP

__all__ = ["ConvAutoencoder", "MLP", "make_model", "model_dataset"]


def model_dataset(config, dataset):
    """The dataset as the model reads it: images as stored for an MLP; for the autoencoder, NHWC
    (its convolutions' layout), permuted once on the host from the CHW planes datasets keep."""
    if config.model.type != "conv_autoencoder":
        return dataset
    if len(dataset.image_shape) != 3:
        raise UserError(f"model.type conv_autoencoder needs images with channels; {dataset.name} has shape "
                        f"{dataset.image_shape}")
    c, h, w = dataset.image_shape

    def hwc(images):
        return np.ascontiguousarray(images.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(len(images), -1))

    return dataclasses.replace(dataset, train_images=hwc(dataset.train_images), test_images=hwc(dataset.test_images),
                               image_shape=(h, w, c))


def make_model(config, backend, dataset, max_rows: int):
    """The model of `config.model` for a dataset already passed through `model_dataset`."""
    m, precision = config.model, config.train.precision
    if m.type == "mlp":
        return MLP(backend, dataset.num_features, list(m.hidden), dataset.num_classes, m.activation, max_rows,
                   precision)
    h, w, _ = dataset.image_shape
    if h % 2 ** len(m.channels) or w % 2 ** len(m.channels):
        raise UserError(f"model.channels: {len(m.channels)} conv + max-pool stages need image sides divisible by "
                        f"{2 ** len(m.channels)}; {dataset.name} images are {h}x{w}")
    return ConvAutoencoder(backend, dataset.image_shape, list(m.channels), m.kernel_size, max_rows, precision)


def input_scale_shift(model, dataset) -> tuple[float, float]:
    """pixel -> model input as one multiply-add: standardised pixels for a classifier, pixels / 255 for
    the autoencoder (which reconstructs them)."""
    if model.task == "classification":
        return 1.0 / (255.0 * dataset.std), -dataset.mean / dataset.std
    return 1.0 / 255.0, 0.0
