"""The 16-bit convolutions' slices copied by cp.async (conv_mma's ring, im2col_async): float64 references, and the
bits of the register staging.

Both stagings feed one mma sequence the same values, so every pass must give the register path's bits. On the
simulator the cases run on RING_MINI (four warps, one copy a thread of each operand's slice), channels whole
16-byte pieces, pixels past a block's rows, K past several slices, taps in the padding; the production tile runs
in the `real_gpu` cases.
"""

import numpy as np
import pytest
from numba import cuda

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.numba_kernels import chunks, conv, conv_mma, im2col_async
from tests import kernel_cases
from tests import reference_conv as ref

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
FP16, BF16 = np.float16, np.uint16
RING_MINI = (32, 32, 2, 2)  # four warps; a 32 x 32 slice of either operand is 128 pieces, one a thread


@pytest.fixture
def mini_ring(monkeypatch):
    """RING_MINI for both stagings, and a record of which one each pass took."""
    monkeypatch.setattr(conv_mma, "TILE", RING_MINI)
    monkeypatch.setattr(conv_mma, "RING_TILE", RING_MINI)
    taken = []
    original = conv_mma.ring
    monkeypatch.setattr(conv_mma, "ring", lambda image, matrix: taken.append(original(image, matrix)) or taken[-1])
    return taken


def _staged(monkeypatch, stages, early):
    monkeypatch.setattr(conv_mma, "RING_STAGES", stages)
    monkeypatch.setattr(conv_mma, "RING_EARLY", early)


def _both_ways(monkeypatch, taken, launch, output, stages=2, early=True):
    """The output's bits through the ring (`stages`, `early`), asserted equal to the register staging's."""
    _staged(monkeypatch, stages, early)
    launch()
    ring_bits = output.copy_to_host()
    assert taken[-1] is True
    _staged(monkeypatch, 0, early)
    launch()
    assert taken[-1] is False
    np.testing.assert_array_equal(ring_bits.view(np.uint8), output.copy_to_host().view(np.uint8))


def _device(rng, shape, dtype, activation=NONE):
    return cuda.to_device(ref.stored(rng, shape, dtype, activation)[0])


@pytest.mark.parametrize("shape, size, activation, dtype, stages, early", [
    ((2, 3, 5, 16, 24), 3, RELU, BF16, 2, True),  # 30 pixels: one ragged block; K = 144, five slices
    ((1, 4, 7, 8, 40), 1, NONE, FP16, 3, False),  # 40 channels out: two column blocks
    ((1, 5, 3, 24, 8), 5, TANH, BF16, 2, True),  # a 5 x 5 kernel on a 5 x 3 image: most taps in the padding
])
def test_forward(rng, monkeypatch, mini_ring, shape, size, activation, dtype, stages, early):
    _staged(monkeypatch, stages, early)
    ref.forward_case(BACKEND, rng, shape, size, activation, dtype)
    assert mini_ring == [True]
    N, H, W, cin, cout = shape
    x, w, b = _device(rng, (N, H, W, cin), dtype), _device(rng, (size, size, cin, cout), dtype), _device(rng, (cout,), dtype)
    y = ref.poisoned(BACKEND, (N, H, W, cout), dtype)
    _both_ways(monkeypatch, mini_ring, lambda: conv.conv2d_forward(x, w, b, y, activation), y, stages, early)


@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 5, 7, 16, 24), 3, RELU, BF16),
    ((2, 3, 4, 8, 16), 1, SIGMOID, FP16),
])
def test_backward_input(rng, monkeypatch, mini_ring, shape, size, activation, dtype):
    ref.backward_input_case(BACKEND, rng, shape, size, activation, dtype, flipped=True)
    assert mini_ring == [True]
    N, H, W, cin, cout = shape
    dy, w = _device(rng, (N, H, W, cout), dtype), _device(rng, (size, size, cin, cout), dtype)
    h, dx = _device(rng, (N, H, W, cin), dtype, activation), ref.poisoned(BACKEND, (N, H, W, cin), dtype)
    flipped = ref.poisoned(BACKEND, (size * size * cin * cout,), dtype)
    _both_ways(monkeypatch, mini_ring, lambda: conv.conv2d_backward_input(dy, w, h, dx, activation, flipped), dx)


@pytest.mark.parametrize("shape, size, beta, dtype", [
    ((1, 5, 7, 16, 24), 3, 0.0, BF16),  # rows 144: five row blocks; 35 pixels, the chunk's end ragged
    ((2, 3, 3, 8, 16), 1, 1.0, FP16),
])
def test_backward_weight(rng, monkeypatch, mini_ring, shape, size, beta, dtype):
    ref.backward_weight_case(BACKEND, rng, shape, size, beta, dtype)
    assert mini_ring == [True]


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_backward_weight_in_several_chunks(rng, monkeypatch, mini_ring, beta):
    """105 pixels in chunks of 64 (the second ragged, ending on an odd pixel), and the register staging's bits."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 32)
    monkeypatch.setattr(chunks, "CHUNK_BLOCKS", 10**6)
    assert conv_mma.weight_plan((3, 5, 7, 8), (3, 3, 8, 16))[:2] == (64, 2)
    ref.backward_weight_case(BACKEND, rng, (3, 5, 7, 8, 16), 3, beta, BF16)
    x, dy = _device(rng, (3, 5, 7, 8), BF16), _device(rng, (3, 5, 7, 16), BF16)
    dw = cuda.to_device(rng.standard_normal((3, 3, 8, 16)).astype(np.float32))
    workspace = ref.poisoned(BACKEND, conv.conv2d_backward_weight_workspace(x.shape, dw.shape, x.dtype), np.float32)
    start = dw.copy_to_host()

    def launch():
        dw.copy_to_device(start)
        conv.conv2d_backward_weight(x, dy, dw, beta, workspace)

    _both_ways(monkeypatch, mini_ring, launch, dw)


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
    """The production tiles and ring, several blocks each way with ragged edges, every pass against float64 and
    the register staging's bits."""
    taken = []
    original = conv_mma.ring
    monkeypatch.setattr(conv_mma, "ring", lambda image, matrix: taken.append(original(image, matrix)) or taken[-1])
    ref.forward_case(BACKEND, rng, (3, 9, 11, 40, 152), 3, RELU, dtype)
    ref.backward_input_case(BACKEND, rng, (3, 9, 11, 152, 40), 3, TANH, dtype, flipped=True)
    ref.backward_weight_case(BACKEND, rng, (3, 9, 11, 40, 152), 3, 1.0, dtype)
    assert taken == [True] * 3
    x, w, b = _device(rng, (3, 9, 11, 40), dtype), _device(rng, (3, 3, 40, 152), dtype), _device(rng, (152,), dtype)
    y = ref.poisoned(BACKEND, (3, 9, 11, 152), dtype)
    stages, early = conv_mma.RING_STAGES, conv_mma.RING_EARLY
    _both_ways(monkeypatch, taken, lambda: conv.conv2d_forward(x, w, b, y, RELU), y, stages, early)
    dw = ref.poisoned(BACKEND, (3, 3, 40, 152), np.float32)
    dy = _device(rng, (3, 9, 11, 152), dtype)
    workspace = ref.poisoned(BACKEND, conv.conv2d_backward_weight_workspace(x.shape, dw.shape, x.dtype), np.float32)
    _both_ways(monkeypatch, taken, lambda: conv.conv2d_backward_weight(x, dy, dw, 0.0, workspace), dw, stages, early)
