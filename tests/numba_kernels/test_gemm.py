"""CUDA GEMM kernels against float64 references, for every block tile.

Shapes are (M, K, N) of the layer: x (M, K), w (K, N), y (M, N). They are tiny
and awkward (1, 7, 33, 65, 130: not multiples of any tile) because on CI the
kernels run under the CUDA simulator; tiny outputs pick the SMALL tile, and
`test_every_tile` forces each tile on a shape whose K spans several K steps.
"""

import numpy as np
import pytest
from numba import cuda

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.numba_kernels import gemm
from tests import reference as ref

pytestmark = pytest.mark.gpu

ALL_ACTIVATIONS = [((7, 33, 65), activation) for activation in (NONE, RELU, TANH, SIGMOID)]


def poisoned(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def random(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def hidden_output(rng, shape, activation):
    """A valid activation output h = act(z) (ReLU outputs include exact zeros)."""
    return ref.activate(random(rng, *shape), activation).astype(np.float32)


@pytest.mark.parametrize("shape, activation", [((1, 1, 1), RELU), *ALL_ACTIVATIONS, ((130, 70, 7), TANH)])
def test_linear_forward(rng, shape, activation):
    m, k, n = shape
    x, w, b = random(rng, m, k), random(rng, k, n), random(rng, n)
    y = poisoned((m, n))
    gemm.linear_forward(cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), y, activation)
    ref.assert_within(y.copy_to_host(), ref.linear_forward(x, w, b, activation), ref.product_tolerance(x, w, b))


@pytest.mark.parametrize("shape, activation", [((1, 1, 1), RELU), *ALL_ACTIVATIONS, ((5, 9, 140), SIGMOID)])
def test_linear_backward_input(rng, shape, activation):
    m, k, n = shape
    dy, w, h = random(rng, m, n), random(rng, k, n), hidden_output(rng, (m, k), activation)
    dx = poisoned((m, k))
    gemm.linear_backward_input(cuda.to_device(dy), cuda.to_device(w), cuda.to_device(h), dx, activation)
    expected = ref.linear_backward_input(dy, w, h, activation)
    ref.assert_within(dx.copy_to_host(), expected, ref.product_tolerance(dy, w.T))


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 33, 65), (130, 9, 7)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_linear_backward_weight(rng, shape, beta):
    m, k, n = shape
    x, dy, old = random(rng, m, k), random(rng, m, n), random(rng, k, n)
    # beta 0 must not read dw: NaN there would leak into the result
    dw = poisoned((k, n)) if beta == 0.0 else cuda.to_device(old)
    gemm.linear_backward_weight(cuda.to_device(x), cuda.to_device(dy), dw, beta)
    expected = ref.linear_backward_weight(x, dy, old, beta)
    ref.assert_within(dw.copy_to_host(), expected, ref.product_tolerance(x.T, dy, extra=old))


def test_row_slices_of_a_larger_buffer(rng):
    """Layers run on buf[:rows] views of buffers sized for the largest batch."""
    x, w, b = random(rng, 20, 5), random(rng, 5, 3), random(rng, 3)
    y_buf = poisoned((20, 3))
    gemm.linear_forward(cuda.to_device(x)[:6], cuda.to_device(w), cuda.to_device(b), y_buf[:6], RELU)
    y = y_buf.copy_to_host()
    ref.assert_within(y[:6], ref.linear_forward(x[:6], w, b, RELU), ref.product_tolerance(x[:6], w, b))
    assert np.isnan(y[6:]).all()  # rows past the slice untouched


@pytest.mark.parametrize("tile", list(gemm.TILES))
def test_every_tile(rng, monkeypatch, tile):
    """Each tile, forced, on one shape: K = 70 spans several K steps of every
    K-split group, and the outputs span several blocks of SMALL."""
    monkeypatch.setattr(gemm, "_pick_tile", lambda rows, columns: tile)
    m, k, n = 37, 70, 45
    x, w, b, dy, old = random(rng, m, k), random(rng, k, n), random(rng, n), random(rng, m, n), random(rng, k, n)
    h = hidden_output(rng, (m, k), SIGMOID)
    y, dx, dw = poisoned((m, n)), poisoned((m, k)), cuda.to_device(old)
    gemm.linear_forward(cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), y, TANH)
    gemm.linear_backward_input(cuda.to_device(dy), cuda.to_device(w), cuda.to_device(h), dx, SIGMOID)
    gemm.linear_backward_weight(cuda.to_device(x), cuda.to_device(dy), dw, 1.0)
    ref.assert_within(y.copy_to_host(), ref.linear_forward(x, w, b, TANH), ref.product_tolerance(x, w, b))
    ref.assert_within(dx.copy_to_host(), ref.linear_backward_input(dy, w, h, SIGMOID), ref.product_tolerance(dy, w.T))
    ref.assert_within(dw.copy_to_host(), ref.linear_backward_weight(x, dy, old, 1.0),
                      ref.product_tolerance(x.T, dy, extra=old))


def test_bitwise_deterministic(rng):
    m, k, n = 33, 17, 7
    x, w, b, dy = (cuda.to_device(a) for a in (random(rng, m, k), random(rng, k, n), random(rng, n), random(rng, m, n)))
    h = cuda.to_device(hidden_output(rng, (m, k), TANH))
    runs = []
    for _ in range(2):
        y, dx, dw = poisoned((m, n)), poisoned((m, k)), poisoned((k, n))
        gemm.linear_forward(x, w, b, y, TANH)
        gemm.linear_backward_input(dy, w, h, dx, TANH)
        gemm.linear_backward_weight(x, dy, dw, 0.0)
        runs.append([a.copy_to_host().view(np.uint32) for a in (y, dx, dw)])
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)


def test_launchers_reject_bad_arguments(rng):
    x, w, b, y = (cuda.to_device(a) for a in (random(rng, 4, 3), random(rng, 3, 2), random(rng, 2), random(rng, 4, 2)))
    with pytest.raises(ValueError, match="w has shape"):
        gemm.linear_forward(x, cuda.to_device(random(rng, 5, 2)), b, y, RELU)
    with pytest.raises(ValueError, match="float32"):
        gemm.linear_forward(x, w, b, cuda.to_device(np.zeros((4, 2))), RELU)
    with pytest.raises(ValueError, match="C-contiguous"):
        gemm.linear_forward(cuda.to_device(random(rng, 4, 6))[:, :3], w, b, y, RELU)
    with pytest.raises(ValueError, match="device array"):
        gemm.linear_forward(x, random(rng, 3, 2), b, y, RELU)
    with pytest.raises(ValueError, match="activation"):
        gemm.linear_forward(x, w, b, y, 7)
    with pytest.raises(ValueError, match="beta"):
        gemm.linear_backward_weight(x, y, cuda.to_device(random(rng, 3, 2)), 0.5)


@pytest.mark.real_gpu
@pytest.mark.parametrize("shape", [(128, 784, 512), (128, 512, 10), (1024, 1000, 777), (2048, 300, 4096)])
def test_mlp_sizes_on_the_gpu(rng, shape):
    """Realistic sizes (every tile gets used), each checked and launched twice."""
    m, k, n = shape
    x, w, b, dy = random(rng, m, k), random(rng, k, n), random(rng, n), random(rng, m, n)
    h = hidden_output(rng, (m, k), RELU)
    d_x, d_w, d_b, d_dy, d_h = (cuda.to_device(a) for a in (x, w, b, dy, h))
    outputs = []
    for _ in range(2):
        y, dx, dw = poisoned((m, n)), poisoned((m, k)), poisoned((k, n))
        gemm.linear_forward(d_x, d_w, d_b, y, RELU)
        gemm.linear_backward_input(d_dy, d_w, d_h, dx, RELU)
        gemm.linear_backward_weight(d_x, d_dy, dw, 0.0)
        outputs.append([a.copy_to_host() for a in (y, dx, dw)])
    y, dx, dw = outputs[0]
    ref.assert_within(y, ref.linear_forward(x, w, b, RELU), ref.product_tolerance(x, w, b))
    ref.assert_within(dx, ref.linear_backward_input(dy, w, h, RELU), ref.product_tolerance(dy, w.T))
    ref.assert_within(dw, ref.linear_backward_weight(x, dy, np.zeros((k, n)), 0.0), ref.product_tolerance(x.T, dy))
    for first, second in zip(*outputs):
        np.testing.assert_array_equal(first.view(np.uint32), second.view(np.uint32))
