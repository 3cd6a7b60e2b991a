"""CUDA convolution kernels against float64 references, in every storage format.

Shapes are (N, H, W, Cin, Cout): tiny and awkward (odd H x W like 5 x 7,
channels that are no multiple of any tile, N from 1 to 3) because on CI the
kernels run under the CUDA simulator, a Python thread per CUDA thread: each
case here launches one or two blocks. Tiny outputs pick the SMALL or
NARROW tile; `test_every_tile` forces each. Outputs of at most
conv_narrow.NARROW_OUT channels take the direct kernels of conv_narrow
(the `narrow` cases), passes that sum at most conv_wide.WIDE_IN channels
a tap (a forward's Cin, an input gradient's Cout) its wide kernels (the
`wide` cases). The `real_gpu` tests run the autoencoder's layers at
real sizes. Cases live in `tests.reference_conv`.
"""

import math

import numpy as np
import pytest

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.numba_kernels import chunks, conv, conv_mma, conv_narrow, conv_plan, conv_wide, current, tiles
from mlptrain.backends.numpy_kernels import conv as numpy_conv
from tests import kernel_cases
from tests import reference_conv as ref
from tests.conftest import ON_SIMULATOR

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
FP32, FP16, BF16 = np.float32, np.float16, np.uint16
MINI_TILE = (32, 16, 2, 2)  # four warps


@pytest.fixture(autouse=True)
def small_tensor_core_tile(monkeypatch):
    """16-bit passes that pair up run on tensor cores: on the simulator, on test_conv_mma's small tile
    (the production one takes ~20 s a block there)."""
    if ON_SIMULATOR:
        monkeypatch.setattr(conv_mma, "TILE", MINI_TILE)


@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 5, 7, 5, 6), 3, RELU, FP32),
    ((2, 3, 4, 6, 9), 1, NONE, FP16),
    ((1, 4, 5, 2, 7), 5, TANH, BF16),
    ((3, 2, 3, 4, 3), 3, SIGMOID, FP32),
])
def test_conv2d_forward(rng, shape, size, activation, dtype):
    ref.forward_case(BACKEND, rng, shape, size, activation, dtype)


@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 5, 7, 3, 5), 3, RELU, FP32),
    ((2, 3, 4, 6, 9), 1, NONE, BF16),
    ((1, 4, 5, 2, 7), 5, TANH, FP16),
])
def test_conv2d_backward_input(rng, shape, size, activation, dtype):
    ref.backward_input_case(BACKEND, rng, shape, size, activation, dtype)
    ref.backward_input_case(BACKEND, rng, shape, size, activation, dtype, flipped=True)


@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_flip_kernel(rng, dtype):
    w = (rng.standard_normal((3, 3, 5, 7)) * 100).astype(np.float32).astype(dtype)
    flipped = current.to_device(np.zeros((63, 5), dtype))
    conv.flip_kernel(current.to_device(w), flipped)
    expected = np.zeros((63, 5), dtype)
    numpy_conv.flip_kernel(w, expected)
    np.testing.assert_array_equal(flipped.copy_to_host(), expected)
    for dh, dw, cin, cout in [(0, 0, 0, 0), (2, 1, 4, 6), (1, 2, 3, 0)]:
        assert expected[(dh * 3 + dw) * 7 + cout, cin] == w[2 - dh, 2 - dw, cin, cout]


@pytest.mark.parametrize("shape, size, beta, dtype", [
    ((1, 5, 7, 3, 5), 3, 0.0, FP32),
    ((2, 3, 4, 6, 9), 1, 1.0, FP16),
    ((1, 4, 5, 2, 7), 5, 1.0, BF16),
])
def test_conv2d_backward_weight(rng, shape, size, beta, dtype):
    ref.backward_weight_case(BACKEND, rng, shape, size, beta, dtype)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_backward_weight_in_several_chunks(rng, monkeypatch, beta):
    """105 pixels in chunks of 64: two pass-1 blocks, the second chunk ragged."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 32)
    monkeypatch.setattr(chunks, "CHUNK_BLOCKS", 10**6)
    assert conv_plan.tiled_weight_chunks((3, 5, 7, 2), (3, 3, 2, 5))[1:] == (64, 2, 3)
    ref.backward_weight_case(BACKEND, rng, (3, 5, 7, 2, 5), 3, beta, FP32)


@pytest.mark.parametrize("tile", list(conv_plan.TILES))
def test_every_tile(rng, monkeypatch, tile):
    """Each tile, forced, on one layer's three passes: 54, 45 and 27 summed
    columns span several K steps of each (SMALL's 64-column step aside).
    Five output channels, and six input channels in the forward: past
    conv_narrow's narrow and wide kernels."""
    monkeypatch.setattr(conv_plan, "pick_tile", lambda rows, columns, weight=False: tile)
    assert not conv_narrow.fits(3, 5) and not conv_wide.wide_fits(3, 6) and not conv_wide.wide_fits(3, 5)
    ref.forward_case(BACKEND, rng, (1, 3, 5, 6, 5), 3, RELU, FP32)
    ref.backward_input_case(BACKEND, rng, (1, 3, 5, 3, 5), 3, RELU, BF16)
    ref.backward_input_case(BACKEND, rng, (1, 3, 5, 3, 5), 3, RELU, FP32, flipped=True)
    ref.backward_weight_case(BACKEND, rng, (1, 3, 5, 3, 5), 3, 1.0, FP32)


# --- narrow outputs: conv_narrow's direct kernels ----------------------------------------------
# Segments of up to 32 // Cout pixels (forward) or 8 (weight gradient), split evenly: W = 9 and 11
# leave a ragged last segment, Cin = 33 to 64 takes lanes (threads) round the channels twice, Cin =
# 230 stages the forward's weights in two blocks of channels and Cin = 260 is two weight-gradient
# blocks of channels.

@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 3, 5, 5, 3), 3, RELU, FP32),
    ((2, 2, 11, 37, 3), 3, TANH, BF16),
    ((1, 3, 9, 33, 4), 3, SIGMOID, FP16),
    ((1, 4, 3, 6, 1), 5, NONE, FP32),
    ((2, 3, 4, 40, 2), 1, RELU, BF16),
    ((1, 2, 7, 64, 1), 3, SIGMOID, FP16),
    ((1, 2, 3, 230, 4), 3, TANH, FP32),
    ((1, 3, 9, 7, 2), 3, NONE, FP16),
])
def test_narrow_forward(rng, shape, size, activation, dtype):
    assert conv_narrow.fits(size, shape[4])
    ref.forward_case(BACKEND, rng, shape, size, activation, dtype)


@pytest.mark.parametrize("shape, size, beta, dtype", [
    ((1, 3, 5, 5, 3), 3, 0.0, FP32),
    ((2, 3, 11, 37, 2), 3, 1.0, FP16),
    ((1, 4, 9, 33, 4), 3, 0.0, BF16),
    ((2, 3, 4, 6, 1), 5, 1.0, FP32),
    ((1, 2, 3, 260, 1), 3, 0.0, BF16),
    ((2, 2, 5, 40, 3), 1, 1.0, FP32),
])
def test_narrow_backward_weight(rng, shape, size, beta, dtype):
    assert conv_narrow.fits(size, shape[4])
    ref.backward_weight_case(BACKEND, rng, shape, size, beta, dtype)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_narrow_backward_weight_in_several_chunks(rng, monkeypatch, beta):
    """10 image rows of 7 pixels in chunks of 4 rows: three pass-1 blocks, the second straddling
    the two images, the third ragged."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 15)
    monkeypatch.setattr(chunks, "CHUNK_BLOCKS", 10**6)
    assert conv_narrow.weight_plan((2, 5, 7, 37), (3, 3, 37, 3)) == (4, 3, 3)
    ref.backward_weight_case(BACKEND, rng, (2, 5, 7, 37, 3), 3, beta, BF16)


def test_narrow_results_are_bitwise_reproducible(rng, monkeypatch):
    """Two launches on the same inputs give the same bits: the forward's butterfly and the weight
    gradient's chunks (three here) sum in fixed orders."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 15)
    x, w, b = (current.to_device(ref.stored(rng, s, FP32)[0]) for s in ((2, 5, 7, 37), (3, 3, 37, 3), (3,)))
    dy = current.to_device(ref.stored(rng, (2, 5, 7, 3), FP32)[0])
    y, dw = ref.poisoned(BACKEND, (2, 5, 7, 3), FP32), ref.poisoned(BACKEND, (3, 3, 37, 3), np.float32)
    workspace = ref.poisoned(BACKEND, conv.conv2d_backward_weight_workspace(x.shape, w.shape, x.dtype), np.float32)
    assert conv_narrow.weight_plan(x.shape, w.shape)[1] == 3
    twice(lambda: conv.conv2d_forward(x, w, b, y, TANH), y)
    twice(lambda: conv.conv2d_backward_weight(x, dy, dw, 0.0, workspace), dw)


def test_narrow_kernels_take_a_few_output_channels():
    assert conv_narrow.fits(3, 3) and conv_narrow.fits(3, conv_narrow.NARROW_OUT) and conv_narrow.fits(5, 1)
    assert not conv_narrow.fits(3, conv_narrow.NARROW_OUT + 1) and not conv_narrow.fits(5, 2)
    assert conv_narrow.even_segment(32, 32 // 3) == 8 and conv_narrow.even_segment(11, 10) == 6


# --- few summed channels: conv_narrow's wide kernels -------------------------------------------
# Rows cut into stretches of up to WIDE_STRETCH pixels (a block each), those into segments of up to
# WIDE_SEGMENT: W = 11 is a stretch of segments 6 + 5, W = 69 stretches of 35 and 34 pixels (segments
# of 7, the last one 6), W = 3 one short segment. Wide channels 5, 37 and 70 leave part of a warp idle, 33 all of a
# second warp but one thread, 300 two blocks of channels (256 + 44).

@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 3, 5, 3, 37), 3, RELU, FP32),
    ((2, 2, 11, 1, 5), 5, TANH, BF16),
    ((1, 3, 9, 4, 70), 3, SIGMOID, FP16),
    ((1, 2, 7, 2, 33), 1, NONE, FP32),
    ((1, 2, 69, 3, 6), 3, RELU, BF16),
    ((1, 2, 3, 2, 300), 3, TANH, FP32),
    ((2, 3, 4, 4, 9), 1, SIGMOID, BF16),
    ((1, 4, 6, 1, 32), 3, NONE, FP16),
])
def test_wide_forward(rng, shape, size, activation, dtype):
    assert conv_wide.wide_fits(size, shape[3]) and not conv_narrow.fits(size, shape[4])
    ref.forward_case(BACKEND, rng, shape, size, activation, dtype)


@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 3, 5, 37, 3), 3, RELU, FP32),
    ((2, 2, 11, 5, 1), 5, TANH, BF16),
    ((1, 3, 9, 70, 4), 3, SIGMOID, FP16),
    ((1, 2, 7, 33, 2), 1, NONE, FP32),
    ((1, 2, 69, 6, 3), 3, RELU, BF16),
    ((1, 2, 3, 300, 2), 3, TANH, FP32),
    ((2, 3, 4, 9, 4), 1, SIGMOID, BF16),
    ((1, 4, 6, 32, 1), 3, NONE, FP16),
    ((1, 3, 4, 3, 3), 3, RELU, FP16),  # narrow on both sides
])
def test_wide_backward_input(rng, shape, size, activation, dtype):
    assert conv_wide.wide_fits(size, shape[4])
    ref.backward_input_case(BACKEND, rng, shape, size, activation, dtype)


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16])
@pytest.mark.parametrize("activation", [NONE, RELU, TANH, SIGMOID])
def test_wide_kernels_in_every_activation_and_format(rng, activation, dtype):
    """Both passes of a 3 -> 7 channel layer, W = 9 in segments 5 + 4; the input gradient is given
    a buffer for the flipped kernel, which the wide kernel does not need."""
    ref.forward_case(BACKEND, rng, (1, 2, 9, 3, 7), 3, activation, dtype)
    ref.backward_input_case(BACKEND, rng, (1, 2, 9, 7, 3), 3, activation, dtype, flipped=True)


def test_wide_results_are_bitwise_reproducible(rng):
    """Two launches on the same inputs give the same bits (each output is one thread's sum in a
    fixed order)."""
    (x, _), (w, _), (b, _) = (ref.stored(rng, s, FP32) for s in ((2, 5, 7, 3), (3, 3, 3, 37), (37,)))
    (dy, _), (h, _) = ref.stored(rng, (2, 5, 7, 3), FP32), ref.stored(rng, (2, 5, 7, 37), FP32, TANH)
    x, w, b, dy, h = (current.to_device(a) for a in (x, w, b, dy, h))
    y, dx = ref.poisoned(BACKEND, (2, 5, 7, 37), FP32), ref.poisoned(BACKEND, (2, 5, 7, 37), FP32)
    flipped = current.to_device(ref.stored(rng, (3, 3, 37, 3), FP32)[0])  # w of the 37 -> 3 layer
    twice(lambda: conv.conv2d_forward(x, w, b, y, TANH), y)
    twice(lambda: conv.conv2d_backward_input(dy, flipped, h, dx, TANH), dx)


def test_wide_kernels_take_a_few_summed_channels():
    assert conv_wide.wide_fits(3, 3) and conv_wide.wide_fits(3, conv_wide.WIDE_IN) and conv_wide.wide_fits(5, 1)
    assert not conv_wide.wide_fits(3, conv_wide.WIDE_IN + 1) and not conv_wide.wide_fits(5, 2)
    assert not conv_wide.wide_fits(7, 1)
    assert conv_wide.wide_plan(32, 256) == (32, 8, 256, 1)  # the autoencoder's RGB layers
    assert conv_wide.wide_plan(69, 37) == (35, 7, 64, 1) and conv_wide.wide_plan(11, 300) == (11, 6, 256, 2)


def test_direct_kernels_are_dispatched_by_channels(monkeypatch):
    """The forward takes the narrow kernel when Cout is narrow, else the wide one when Cin is (a
    3 -> 3 layer stays narrow); the input gradient the wide one when Cout is narrow."""
    calls = []
    for module, name in ((conv_narrow, "narrow_forward"), (conv_wide, "wide_forward"),
                         (conv_wide, "wide_backward_input")):
        monkeypatch.setattr(module, name, lambda *args, name=name: calls.append(name))
    device = lambda *shape: current.to_device(np.zeros(shape, FP32))  # noqa: E731
    x3, x256 = device(1, 2, 3, 3), device(1, 2, 3, 256)
    conv.conv2d_forward(x3, device(3, 3, 3, 256), device(256), x256, RELU)
    conv.conv2d_forward(x3, device(3, 3, 3, 3), device(3), device(1, 2, 3, 3), RELU)
    conv.conv2d_forward(x256, device(3, 3, 256, 3), device(3), x3, NONE)
    conv.conv2d_backward_input(x3, device(3, 3, 256, 3), x256, device(1, 2, 3, 256), RELU)
    assert calls == ["wide_forward", "narrow_forward", "narrow_forward", "wide_backward_input"]


def test_bias_gradient_is_reduce_bias_backward(rng):
    ref.bias_gradient_case(BACKEND, rng, (2, 5, 7, 6), 1.0)


def test_tile_choice_avoids_padding_narrow_outputs():
    assert conv_plan.pick_tile(256 * 32 * 32, 256) == "wide"
    assert conv_plan.pick_tile(3 * 3 * 256, 128, weight=True) == "square"
    assert conv_plan.pick_tile(256 * 32 * 32, 8) == "narrow"  # 8 channels, past conv_narrow's
    assert conv_plan.pick_tile(3 * 3 * 512, 8, weight=True) == "narrow"  # and its weight gradient
    assert conv_plan.pick_tile(3 * 3 * 3, 256, weight=True) == "small"  # the first layer's weight gradient


def test_workspace_fills_the_gpu_and_serves_smaller_batches():
    layers = [((32, 32, 3), 256), ((16, 16, 256), 128), ((8, 8, 128), 128), ((16, 16, 128), 256), ((32, 32, 256), 3)]
    for (H, W, cin), cout in layers:
        w_shape = (3, 3, cin, cout)
        sizes = [conv.conv2d_backward_weight_workspace((n, H, W, cin), w_shape, FP32) for n in range(0, 257)]
        assert sizes == sorted(sizes) and sizes[0] == 9 * cin * cout
        if conv_narrow.fits(3, cout):  # a block per chunk and 256 input channels
            _, count, most = conv_narrow.weight_plan((256, H, W, cin), w_shape)
            assert count * math.ceil(cin / conv_narrow.WEIGHT_THREADS) >= chunks.CHUNK_BLOCKS // 2
            assert sizes[-1] == most * 9 * cin * cout
            continue
        name, chunk, count, _ = conv_plan.tiled_weight_chunks((256, H, W, cin), w_shape)
        grid, _ = tiles.launch_grid(9 * cin, cout, conv_plan.TILES[name][0])
        assert grid[0] * grid[1] * count >= chunks.CHUNK_BLOCKS // 2 and chunk % chunks.CHUNK_STEP == 0


def test_launchers_reject_bad_arguments(rng):
    device = lambda *shape, dtype=FP32: current.to_device(np.zeros(shape, dtype))  # noqa: E731
    x, w, b, y = device(1, 4, 4, 3), device(3, 3, 3, 5), device(5), device(1, 4, 4, 5)
    with pytest.raises(ValueError, match="odd size"):
        conv.conv2d_forward(x, device(2, 2, 3, 5), b, y, RELU)
    with pytest.raises(ValueError, match="w has shape"):
        conv.conv2d_forward(x, device(3, 3, 4, 5), b, y, RELU)
    with pytest.raises(ValueError, match="y has shape"):
        conv.conv2d_forward(x, w, b, device(1, 4, 5, 5), RELU)
    with pytest.raises(ValueError, match="float16"):
        conv.conv2d_forward(x, w, b, device(1, 4, 4, 5, dtype=FP16), RELU)
    with pytest.raises(ValueError, match="device array"):
        conv.conv2d_forward(np.zeros((1, 4, 4, 3), FP32), w, b, y, RELU)
    with pytest.raises(ValueError, match="activation"):
        conv.conv2d_forward(x, w, b, y, 7)
    with pytest.raises(ValueError, match="h has shape"):
        conv.conv2d_backward_input(y, w, y, x, RELU)
    with pytest.raises(ValueError, match="flipped has 134 elements, needs 135"):
        conv.conv2d_backward_input(y, w, x, x, RELU, device(134))
    with pytest.raises(ValueError, match="flipped must be"):
        conv.conv2d_backward_input(y, w, x, x, RELU, device(135, dtype=FP16))
    with pytest.raises(ValueError, match="beta"):
        conv.conv2d_backward_weight(x, y, device(3, 3, 3, 5), 0.5, device(10**5))
    with pytest.raises(ValueError, match="workspace has 3 elements"):
        conv.conv2d_backward_weight(x, y, device(3, 3, 3, 5), 0.0, device(3))


# --- real sizes: skipped on the simulator -------------------------------------------

AUTOENCODER = [  # (H, W, Cin, Cout, activation of the layer, activation of its input)
    (32, 32, 3, 256, RELU, NONE),
    (16, 16, 256, 128, RELU, RELU),
    (8, 8, 128, 128, RELU, RELU),
    (16, 16, 128, 256, RELU, RELU),
    (32, 32, 256, 3, NONE, RELU),
]


def twice(launch, output):
    """Host copy of `output` after two launches, asserted bitwise equal."""
    runs = []
    for _ in range(2):
        launch()
        runs.append(output.copy_to_host())
    np.testing.assert_array_equal(runs[0].view(np.uint8), runs[1].view(np.uint8))
    return runs[0]


@pytest.mark.real_gpu
@pytest.mark.parametrize("dtype", [FP32, FP16, BF16])
@pytest.mark.parametrize("layer", AUTOENCODER)
def test_autoencoder_layers_on_the_gpu(rng, layer, dtype):
    """The autoencoder's five layers at batch 8: all three passes checked
    against float64 and launched twice for bitwise-identical results."""
    H, W, cin, cout, activation, input_activation = layer
    (x, xv), (w, wv), (b, bv) = (ref.stored(rng, s, dtype) for s in ((8, H, W, cin), (3, 3, cin, cout), (cout,)))
    (dy, dyv), (h, hv) = ref.stored(rng, (8, H, W, cout), dtype), ref.stored(rng, (8, H, W, cin), dtype, RELU)
    d = {name: current.to_device(a) for name, a in dict(x=x, w=w, b=b, dy=dy, h=h).items()}
    y, dx = ref.poisoned(BACKEND, (8, H, W, cout), dtype), ref.poisoned(BACKEND, (8, H, W, cin), dtype)
    dw = ref.poisoned(BACKEND, (3, 3, cin, cout), np.float32)
    workspace = ref.poisoned(BACKEND, conv.conv2d_backward_weight_workspace(x.shape, w.shape, x.dtype), np.float32)
    tf32x3 = {p: ref.runs_tf32x3(BACKEND, p, x.shape, w.shape, dtype) for p in ("forward", "backward_weight")}
    got = twice(lambda: conv.conv2d_forward(d["x"], d["w"], d["b"], y, activation), y)
    ref.assert_within(ref.stored_values(got), ref.conv2d_forward(xv, wv, bv, activation),
                      ref.forward_tolerance(xv, wv, bv, activation, dtype, tf32x3["forward"]))
    got = twice(lambda: conv.conv2d_backward_input(d["dy"], d["w"], d["h"], dx, input_activation), dx)
    ref.assert_within(ref.stored_values(got), ref.conv2d_backward_input(dyv, wv, hv, input_activation),
                      ref.backward_input_tolerance(dyv, wv, hv, input_activation, dtype))
    got = twice(lambda: conv.conv2d_backward_weight(d["x"], d["dy"], dw, 0.0, workspace), dw)
    old = np.zeros(w.shape, np.float32)
    ref.assert_within(got, ref.conv2d_backward_weight(xv, dyv, old, 0.0),
                      ref.backward_weight_tolerance(xv, dyv, old, 0.0, dtype, tf32x3["backward_weight"]))
