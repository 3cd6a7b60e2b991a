"""A trained model's parameters as a safetensors file (the `safetensors` package's NumPy API: no torch).

Tensors keep mlptrain's names and layouts: `fc{i}.weight` (in, out) and `fc{i}.bias` for the MLP,
`conv{i}.weight` (k, k, in, out) and `conv{i}.bias` for the autoencoder (NHWC activations), float32 master
weights. The metadata (string to string, as the format allows) carries what a reader needs to run them:
`config` (the run's config.yaml as JSON), `model`, `image_shape`, `input_scale` and `input_shift` (pixel ->
pixel * scale + shift), `class_names`, `run` and `checkpoint`.
"""

from __future__ import annotations

import json

import numpy as np

from mlptrain.config.load import resolved_dict


def metadata(trained) -> dict[str, str]:
    config = resolved_dict(trained.config)  # as the run's config.yaml holds it: its own model type's keys
    return {
        "format": "mlptrain", "run": trained.run_dir.resolve().name, "checkpoint": trained.checkpoint,
        "model": trained.config.model.type, "config": json.dumps(config),
        "image_shape": json.dumps(list(trained.image_shape)), "input_scale": repr(float(trained.scale)),
        "input_shift": repr(float(trained.shift)), "class_names": json.dumps(trained.class_names),
    }


def safetensors_bytes(trained) -> bytes:
    """The file's bytes (written by the caller, atomically)."""
    # only when exporting: no other command needs it
    from safetensors.numpy import save

    tensors = {name: np.ascontiguousarray(value, np.float32) for name, value in trained.parameters().items()}
    return save(tensors, metadata=metadata(trained))
