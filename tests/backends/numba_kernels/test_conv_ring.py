"""The 16-bit convolutions' slices copied by cp.async (conv_mma's ring, im2col_async): float64 references, and the
bits of the register staging.

Both stagings feed one mma sequence the same values, so every pass must give the register path's bits. On the
simulator the cases run on RING_MINI (four warps, one copy a thread of each operand's slice), channels whole
16-byte pieces, pixels past a block's rows, K past several slices, taps in the padding; the production tiles run
in the `real_gpu` case.
"""

import numpy as np
import pytest
from numba import cuda

from mlptrain.activation import NONE, RELU, TANH
from mlptrain.backends.numba_kernels import chunks, conv_mma, im2col_async
from tests import kernel_cases
from tests import reference_conv as ref

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
FP16, BF16 = np.float16, np.uint16
RING_MINI = (32, 32, 2, 2)  # four warps; a 32 x 32 slice of either operand is 128 pieces, one a thread


def stagings(monkeypatch, module, switches, ring=(2, True)):
    """(set up, staging) pairs for reference_conv.two_stagings_case: `module`'s ring (its `switches`, the names of
    its slices constant and the others', set to `ring`), then its registers (slices 0); each set-up returns the list
    in which `module.ring` records what it answered."""
    original = module.ring

    def set_up(values):
        def apply():
            taken = []
            for name, value in zip(switches, values):
                monkeypatch.setattr(module, name, value)
            def ring(image, matrix):
                taken.append(original(image, matrix))
                return taken[-1]

            monkeypatch.setattr(module, "ring", ring)
            return taken

        return apply

    return [(set_up(ring), True), (set_up((0, *ring[1:])), False)]


@pytest.fixture
def mini_ring(monkeypatch):
    monkeypatch.setattr(conv_mma, "TILE", RING_MINI)
    monkeypatch.setattr(conv_mma, "RING_TILE", RING_MINI)
    return lambda ring=(2, True, True): stagings(monkeypatch, conv_mma, SWITCHES, ring)


SWITCHES = ("RING_STAGES", "RING_EARLY", "RING_LDMATRIX")


@pytest.mark.parametrize("shape, size, activation, dtype, ring", [
    ((2, 3, 5, 16, 24), 3, RELU, BF16, (2, True, True)),  # 30 pixels: one ragged block; K = 144, five slices
    # 40 channels out: two column blocks; a ring of three, late, its fragments a shared load a register
    ((1, 4, 7, 8, 40), 1, NONE, FP16, (3, False, False)),
])
def test_forward(rng, mini_ring, shape, size, activation, dtype, ring):
    ref.two_stagings_case(BACKEND, rng, "forward", shape, size, activation, dtype, mini_ring(ring))


def test_forward_with_most_taps_in_the_padding(rng, mini_ring):
    """A 5 x 5 kernel on a 5 x 3 image."""
    ref.two_stagings_case(BACKEND, rng, "forward", (1, 5, 3, 8, 8), 5, TANH, BF16, mini_ring())


def test_backward_input(rng, mini_ring):
    ref.two_stagings_case(BACKEND, rng, "backward_input", (1, 3, 5, 16, 8), 3, RELU, FP16, mini_ring())


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_backward_weight_in_several_chunks(rng, monkeypatch, mini_ring, beta):
    """35 pixels in chunks of 24 (the second ragged, ending on an odd pixel); rows 72: three row blocks."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 12)
    monkeypatch.setattr(chunks, "CHUNK_STEP", 8)
    monkeypatch.setattr(chunks, "CHUNK_BLOCKS", 10**6)
    assert conv_mma.weight_plan((1, 5, 7, 8), (3, 3, 8, 8))[:2] == (24, 2)
    ref.two_stagings_case(BACKEND, rng, "backward_weight", (1, 5, 7, 8, 8), 3, beta, BF16, mini_ring())


def test_the_ring_takes_whole_pieces_only(monkeypatch):
    """Channels a multiple of 8 on both sides, 16-byte aligned; anything else through registers, with RING_STAGES
    0 too."""
    def device(*shape):
        return cuda.to_device(np.zeros(shape, BF16))

    image, matrix = device(1, 3, 5, 16), device(9 * 16, 24)
    assert conv_mma.ring(image, matrix)
    assert not conv_mma.ring(device(1, 3, 5, 12), matrix)  # 24 bytes a pixel
    assert not conv_mma.ring(image, device(9 * 16, 20))  # rows of 40 bytes
    flat = device(1 + 3 * 5 * 16)
    assert not conv_mma.ring(flat[1:].reshape(1, 3, 5, 16), matrix)  # two bytes past an aligned start
    assert not im2col_async.copyable_image(device(3 * 5, 16))  # not an image
    monkeypatch.setattr(conv_mma, "RING_STAGES", 0)
    assert not conv_mma.ring(image, matrix)


@pytest.mark.real_gpu
@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_production_ring_on_awkward_shapes(rng, monkeypatch, dtype):
    """The production tiles and ring, several blocks each way with ragged edges, every pass."""
    both = stagings(monkeypatch, conv_mma, SWITCHES, tuple(getattr(conv_mma, name) for name in SWITCHES))
    ref.two_stagings_case(BACKEND, rng, "forward", (3, 9, 11, 40, 152), 3, RELU, dtype, both)
    ref.two_stagings_case(BACKEND, rng, "backward_input", (3, 9, 11, 152, 40), 3, TANH, dtype, both)
    ref.two_stagings_case(BACKEND, rng, "backward_weight", (3, 9, 11, 40, 152), 3, 1.0, dtype, both)
