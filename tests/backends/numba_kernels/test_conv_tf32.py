"""The float32 convolutions on tensor cores at float32 accuracy (conv_tf32: 3xTF32) against float64 references, at
float32's error bounds, and the same bits whether a pass's slices come by cp.async or through registers.

On the simulator the cases run on MINI_TILE (four warps; one copy a thread of each operand's 16-deep slice):
channels multiples of 4 (above conv_wide's and conv_narrow's 4), pixels past a block's rows, K past several slices,
taps in the padding. K is 72 in every case: 3xTF32 leaves each product within ~2^-21 of its value (gemm_tf32),
inside the bound float32's own rounding gives a sum of that many terms. The production tile runs in the `real_gpu`
case.
"""

import numpy as np
import pytest

from mlptrain.backends.numba_kernels import chunks, conv_plan, conv_tf32
from mlptrain.activation import RELU, SIGMOID, TANH
from tests import kernel_cases
from tests import reference_conv as ref
from tests.backends.numba_kernels.test_conv_ring import stagings

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
FP32 = np.float32
MINI_TILE = (32, 32, 2, 2, 16)


@pytest.fixture
def tf32(monkeypatch):
    """conv_tf32 on (as on a GPU) with MINI_TILE; its stagings, ring then registers."""
    monkeypatch.setattr(conv_plan, "TF32X3", True)
    monkeypatch.setattr(conv_tf32, "TILE", MINI_TILE)
    return stagings(monkeypatch, conv_tf32, ("STAGES", "EARLY"))


def test_forward(rng, tf32):
    """15 pixels, a 3 x 3 kernel over 8 channels into 12: K = 72, five 16-deep slices, the last ragged."""
    ref.two_stagings_case(BACKEND, rng, "forward", (1, 3, 5, 8, 12), 3, RELU, FP32, tf32)


def test_backward_input(rng, tf32):
    ref.two_stagings_case(BACKEND, rng, "backward_input", (1, 3, 5, 12, 8), 3, SIGMOID, FP32, tf32)


def test_backward_weight_in_several_chunks(rng, monkeypatch, tf32):
    """35 pixels in chunks of 24 (the second ragged, ending on an odd pixel); beta 1 reads dw."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 12)
    monkeypatch.setattr(chunks, "CHUNK_STEP", 8)
    monkeypatch.setattr(chunks, "CHUNK_BLOCKS", 10**6)
    assert conv_tf32.weight_plan((1, 5, 7, 8), (3, 3, 8, 8))[:2] == (24, 2)
    ref.two_stagings_case(BACKEND, rng, "backward_weight", (1, 5, 7, 8, 8), 3, 1.0, FP32, tf32)


def test_float32_passes_whose_channels_are_whole_pieces_take_tf32x3(monkeypatch):
    """Channels a multiple of 4 on both sides, compute capability 8.0 or later, TF32X3 on; the input gradient only
    given the flipped kernel's buffer; 16-bit storage keeps its own tensor cores."""
    monkeypatch.setattr(conv_plan, "TF32X3", True)
    new, old = (9, 0), (7, 5)
    x, w = (2, 16, 16, 256), (3, 3, 256, 128)
    for pass_ in conv_plan.PASSES:
        assert conv_plan.plan(pass_, x, w, FP32, new).variant == "tf32x3", pass_
        assert conv_plan.plan(pass_, x, w, FP32, old).variant == "tiled", pass_
        assert conv_plan.plan(pass_, x, w, np.uint16, new).variant == "tensor_cores", pass_
    assert conv_plan.plan("backward_input", x, w, FP32, new, flipped=False).variant == "tiled"
    assert conv_plan.plan("forward", (2, 8, 8, 6), (3, 3, 6, 8), FP32, new).variant == "tiled"  # 24-byte pixels
    assert conv_plan.plan("backward_weight", (2, 8, 8, 3), (3, 3, 3, 256), FP32, new).variant == "tiled"
    weight = conv_plan.plan("backward_weight", x, w, FP32, new)
    assert weight.workspace == conv_tf32.weight_plan(x, w)[2] * 3 * 3 * 256 * 128
    monkeypatch.setattr(conv_plan, "TF32X3", False)
    assert conv_plan.plan("forward", x, w, FP32, new).variant == "tiled"


@pytest.mark.real_gpu
def test_production_tile_on_awkward_shapes(rng, monkeypatch):
    """The production tile and ring, several blocks each way with ragged edges, every pass."""
    both = stagings(monkeypatch, conv_tf32, ("STAGES", "EARLY"), (conv_tf32.STAGES, conv_tf32.EARLY))
    ref.two_stagings_case(BACKEND, rng, "forward", (3, 9, 11, 36, 148), 3, RELU, FP32, both)
    ref.two_stagings_case(BACKEND, rng, "backward_input", (3, 9, 11, 148, 36), 3, TANH, FP32, both)
    ref.two_stagings_case(BACKEND, rng, "backward_weight", (3, 9, 11, 36, 148), 3, 0.0, FP32, both)
