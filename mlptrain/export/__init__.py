"""`mlptrain export`: a trained run's model as a file other tools read (safetensors, ONNX).

An ONNX export is checked before it is written: onnxruntime runs it on a batch of the run's test images
and its outputs are compared with mlptrain's own forward pass of the same float32 weights (the CPU
backend); a difference beyond float32 rounding refuses the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlptrain.errors import UserError
from mlptrain.export.onnx_graph import onnx_model, require_onnx, run_onnx
from mlptrain.export.safetensors_file import safetensors_bytes
from mlptrain.inference.model import softmax

FORMATS = {"safetensors": ".safetensors", "onnx": ".onnx"}
CHECK_IMAGES = 256  # test images the ONNX graph is checked on
# float32 rounding of the same sums in another order stays far below this, relative to the outputs' size
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Check:
    """onnxruntime's outputs against mlptrain's on `images` test images."""

    output: str  # logits or reconstruction
    images: int
    max_abs_diff: float
    max_abs_value: float  # the largest output, for scale
    probabilities_diff: float | None = None  # a classifier's softmax outputs, compared the same way

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= TOLERANCE * max(1.0, self.max_abs_value)


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: use {' or '.join(FORMATS)}")
    if fmt == "onnx":
        require_onnx()
    return fmt


def export_bytes(trained, fmt: str) -> tuple[bytes, Check | None]:
    """The file's bytes and, for ONNX, its check; raises UserError when the check fails."""
    if fmt == "safetensors":
        return safetensors_bytes(trained), None

    model = onnx_model(trained)
    check = check_onnx(trained, model)
    if not check.passed:
        raise UserError(f"the ONNX graph's {check.output} differ from mlptrain's by up to {check.max_abs_diff:.3g} "
                        f"(values up to {check.max_abs_value:.3g}); not written. This is a bug: please report it")
    return model.SerializeToString(), check


def check_onnx(trained, model) -> Check:
    """Run `model` with onnxruntime and `trained` with mlptrain on the first CHECK_IMAGES test images."""
    pixels = trained.dataset.test_images[:CHECK_IMAGES]
    expected = trained.images(pixels).reshape(len(pixels), -1)
    outputs = run_onnx(model, pixels.reshape(-1, *trained.image_shape).astype(np.float32))
    got = outputs[0].reshape(len(pixels), -1)
    probabilities = None
    if trained.classifies:
        probabilities = float(np.abs(outputs[1] - softmax(expected)).max())
    return Check("logits" if trained.classifies else "reconstruction", len(pixels),
                 float(np.abs(got - expected).max()), float(np.abs(expected).max()), probabilities)
