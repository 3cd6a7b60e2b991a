"""`mlptrain export`: a trained run's model as a file other tools read (safetensors, ONNX).

An ONNX export is checked before it is written: onnxruntime runs it on a batch of the run's test images
(random images of the same kind when the run's record stands in for its dataset) and its outputs are compared with mlptrain's own forward pass of the same float32 weights (the CPU
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
    source: str  # what the images were: "test images" or "random images"
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
    """Run `model` with onnxruntime and `trained` with mlptrain on the first CHECK_IMAGES test images, or as many
    random ones of the dataset's kind when the run's record stands in for its dataset (no images at hand)."""
    pixels, source = trained.dataset.test_images[:CHECK_IMAGES], "test images"
    if not len(pixels):
        pixels, source = random_images(trained.dataset, CHECK_IMAGES), "random images"
    expected = trained.images(pixels).reshape(len(pixels), -1)
    outputs = run_onnx(model, pixels.reshape(-1, *trained.image_shape).astype(np.float32))
    got = outputs[0].reshape(len(pixels), -1)
    probabilities = None
    if trained.classifies:
        probabilities = float(np.abs(outputs[1] - softmax(expected)).max())
    return Check("logits" if trained.classifies else "reconstruction", len(pixels), source,
                 float(np.abs(got - expected).max()), float(np.abs(expected).max()), probabilities)


def random_images(dataset, count: int) -> np.ndarray:
    """`count` rows of the dataset's kind (seeded): pixels uniform in 0..255, or features spread as its own
    (its mean and standard deviation)."""
    rng = np.random.default_rng(0)
    width = int(np.prod(dataset.image_shape))
    if dataset.test_images.dtype == np.uint8:
        return rng.integers(0, 256, (count, width), dtype=np.uint8)
    values = (rng.standard_normal((count, width)) * dataset.std + dataset.mean) * dataset.value_scale
    return values.astype(np.float32)
