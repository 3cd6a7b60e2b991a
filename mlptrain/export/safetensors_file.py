"""A trained model's parameters as a safetensors file (the `safetensors` package's NumPy API: no torch).

The tensors are named and laid out as PyTorch's modules hold them, so that `load_state_dict` of the
equivalent `torch.nn.Sequential` takes the file as it is (docs/inference.md shows the modules):
`fc{i}.weight` (out, in) and `fc{i}.bias` of `nn.Linear` for the MLP; `conv{i}.weight` (out, in, k, k)
and `conv{i}.bias` of `nn.Conv2d` (NCHW) for the autoencoder. mlptrain itself holds them (in, out) and
(k, k, in, out). They are the float32 master weights. The metadata (string to string, as the format
allows) carries what a reader needs to run them: `layout` ("pytorch"), `config` (the run's config.yaml
as JSON), `model`, `image_shape`, `input_scale` and `input_shift` (pixel -> pixel * scale + shift, the
model's input), `class_names`, `run` and `checkpoint`.
"""

from __future__ import annotations

import json

import numpy as np

from mlptrain.config.load import resolved_dict


def metadata(trained) -> dict[str, str]:
    config = resolved_dict(trained.config)  # as the run's config.yaml holds it: its own model type's keys
    return {
        "format": "mlptrain", "layout": "pytorch", "run": trained.run_dir.resolve().name, "checkpoint": trained.checkpoint,
        "model": trained.config.model.type, "config": json.dumps(config),
        "image_shape": json.dumps(list(trained.image_shape)), "input_scale": repr(float(trained.scale)),
        "input_shift": repr(float(trained.shift)), "class_names": json.dumps(trained.class_names),
    }


def safetensors_bytes(trained) -> bytes:
    """The file's bytes (written by the caller, atomically)."""
    # only when exporting: no other command needs it
    from safetensors.numpy import save

    tensors = {name: np.ascontiguousarray(torch_layout(value), np.float32)
               for name, value in trained.parameters().items()}
    return save(tensors, metadata=metadata(trained))


def torch_layout(value: np.ndarray) -> np.ndarray:
    """A parameter as PyTorch holds it: a dense weight (in, out) -> (out, in), a convolution's (k, k, in, out)
    -> (out, in, k, k) (both layers compute cross-correlations, so no kernel is flipped); a bias as it is."""
    if value.ndim == 2:
        return value.T
    if value.ndim == 4:
        return value.transpose(3, 2, 0, 1)
    return value
