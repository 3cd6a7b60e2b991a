"""16-bit convolutions with a side of fewer than eight channels on conv_mma's ring, that side padded with zeros first
(conv_padded): float64 references, the bits of the same pass on arrays padded by hand, the same bits run to run, and
what the plan picks where the buffers fall short.

On the simulator the cases run on small tiles (RING_MINI for the ring and the weight gradient, NARROW_MINI for a
padded Cout): ragged pixel blocks, one or three channels on the narrow side, taps in the padding, several chunks of
the weight gradient; the production tiles run in the `real_gpu` case.
"""

import numpy as np
import pytest

from mlptrain.activation import NONE, RELU, TANH
from mlptrain.backends.numba_kernels import chunks, conv_mma, conv_plan, current
from tests import kernel_cases
from tests import reference_conv as ref

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
CONV = BACKEND.kernels.conv
FP16, BF16 = np.float16, np.uint16
RING_MINI = (32, 32, 2, 2)  # four warps; a 32 x 32 slice of either operand is 128 pieces, one a thread
NARROW_MINI = (32, 16, 2, 1)  # two warps; a 32 x 16 slice of the padded kernel is 64 pieces, one a thread
# every pass conv_padded can take, those the plan leaves out (slower, so far) included
ALL = frozenset({("forward", "cin"), ("forward", "cout"), ("backward_input", "cout"), ("backward_weight", "cin")})


@pytest.fixture
def mini(monkeypatch):
    monkeypatch.setattr(conv_mma, "TILE", RING_MINI)
    monkeypatch.setattr(conv_mma, "RING_TILE", RING_MINI)
    monkeypatch.setattr(conv_mma, "NARROW_RING_TILE", NARROW_MINI)
    monkeypatch.setattr(conv_plan, "PADDED", ALL)


def pad(values, channels, axis=-1):
    """An array with zeros appended along `axis` up to `channels`."""
    widths = [(0, 0)] * values.ndim
    widths[axis] = (0, channels - values.shape[axis])
    return np.pad(values, widths)


def scratch(x_shape, w_shape, dtype):
    return ref.poisoned(BACKEND, (CONV.conv2d_scratch(x_shape, w_shape, dtype),), dtype)


def run(pass_, arrays, option, dtype, buffer=True):
    """One pass of the numba backend over host `arrays` (forward: x, w, b; input gradient: dy, w, h; weight gradient:
    x, dy and the old dw) into a fresh poisoned output, with a scratch buffer or workspace of the launcher's asking
    (`buffer` False: the input gradient's flipped buffer only KS*KS*Cin*Cout); the output on the host."""
    d = [BACKEND.to_device(a) for a in arrays]
    if pass_ == "forward":
        x, w, b = arrays
        out = ref.poisoned(BACKEND, x.shape[:3] + (w.shape[3],), dtype)
        CONV.conv2d_forward(*d, out, option, scratch(x.shape, w.shape, dtype) if buffer else None)
    elif pass_ == "backward_input":
        dy, w, h = arrays
        out = ref.poisoned(BACKEND, h.shape, dtype)
        size = scratch(h.shape, w.shape, dtype) if buffer else ref.poisoned(BACKEND, (w.size,), dtype)
        CONV.conv2d_backward_input(*d, out, option, size)
    else:
        x, dy, old = arrays
        out = ref.poisoned(BACKEND, old.shape, np.float32) if option == 0.0 else d[2]
        workspace = CONV.conv2d_backward_weight_workspace(x.shape, old.shape, x.dtype)
        CONV.conv2d_backward_weight(d[0], d[1], out, option, ref.poisoned(BACKEND, (max(workspace, 1),), np.float32))
    return BACKEND.to_host(out)


def case(rng, pass_, shape, size, option, dtype, padded):
    """A pass of layer shape (N, H, W, cin, cout) on the padded plan `padded`: within its float64 bound, its bits
    twice over, and those of the unpadded pass on arrays padded by hand (the padding's outputs dropped)."""
    N, H, W, cin, cout = shape
    x_shape, w_shape = (N, H, W, cin), (size, size, cin, cout)
    assert CONV.conv2d_variants(x_shape, w_shape, dtype)[pass_] == f"tensor_cores/{padded}_padded"
    kernel, kernel_values = ref.stored(rng, w_shape, dtype)
    piece = 8
    if pass_ == "forward":
        (x, xv), (b, bv) = ref.stored(rng, x_shape, dtype), ref.stored(rng, (cout,), dtype)
        arrays = (x, kernel, b)
        by_hand = ((pad(x, piece), pad(kernel, piece, 2), b) if padded == "cin" else
                   (x, pad(kernel, piece), pad(b, piece)))
        expected = ref.conv2d_forward(xv, kernel_values, bv, option)
        tolerance = ref.forward_tolerance(xv, kernel_values, bv, option, dtype)
    elif pass_ == "backward_input":
        (dy, dyv), (h, hv) = ref.stored(rng, (N, H, W, cout), dtype), ref.stored(rng, x_shape, dtype, option)
        arrays = (dy, kernel, h)
        by_hand = (pad(dy, piece), pad(kernel, piece), h)
        expected = ref.conv2d_backward_input(dyv, kernel_values, hv, option)
        tolerance = ref.backward_input_tolerance(dyv, kernel_values, hv, option, dtype)
    else:
        (x, xv), (dy, dyv) = ref.stored(rng, x_shape, dtype), ref.stored(rng, (N, H, W, cout), dtype)
        old = rng.standard_normal(w_shape).astype(np.float32)
        arrays = (x, dy, old)
        by_hand = (pad(x, piece), dy, pad(old, piece, 2))
        expected = ref.conv2d_backward_weight(xv, dyv, old, option)
        tolerance = ref.backward_weight_tolerance(xv, dyv, old, option, dtype)
    got, again = run(pass_, arrays, option, dtype), run(pass_, arrays, option, dtype)
    np.testing.assert_array_equal(got.view(np.uint8), again.view(np.uint8))
    hand = run(pass_, by_hand, option, dtype)
    if pass_ == "forward" and padded == "cout":
        hand = hand[..., :cout]
    elif pass_ == "backward_weight":
        hand = hand[:, :, :cin]
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(hand).view(np.uint8))
    ref.assert_within(got if pass_ == "backward_weight" else ref.stored_values(got), expected, tolerance)


def test_forward_with_few_input_channels(rng, mini):
    """30 pixels: a ragged block; K = 72, three slices, the last part padding."""
    case(rng, "forward", (2, 3, 5, 3, 24), 3, RELU, BF16, "cin")


@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((2, 3, 5, 16, 3), 3, NONE, BF16),  # the decoder's RGB output: 3 of the narrow tile's 16 columns
    ((1, 4, 7, 8, 5), 1, RELU, FP16),
])
def test_forward_with_few_output_channels(rng, mini, shape, size, activation, dtype):
    case(rng, "forward", shape, size, activation, dtype, "cout")


def test_backward_input_with_few_output_channels(rng, mini):
    """One channel, on a 2 x 3 image: most taps in the padding."""
    case(rng, "backward_input", (1, 2, 3, 8, 1), 3, TANH, FP16, "cout")


@pytest.mark.parametrize("beta, dtype", [(0.0, BF16), (1.0, FP16)])
def test_backward_weight_with_few_input_channels_in_several_chunks(rng, monkeypatch, mini, beta, dtype):
    """35 pixels in chunks of 24, the second ragged; 3 channels padded to 8: 72 rows, three row blocks."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 12)
    monkeypatch.setattr(chunks, "CHUNK_STEP", 8)
    monkeypatch.setattr(chunks, "CHUNK_BLOCKS", 10**6)
    assert conv_mma.weight_plan((1, 5, 7, 8), (3, 3, 8, 16))[:2] == (24, 2)
    case(rng, "backward_weight", (1, 5, 7, 3, 16), 3, beta, dtype, "cin")


def test_the_plan_pads_only_what_it_can_and_where_the_buffers_hold_it(monkeypatch):
    capability = current.kernel_capability()

    def label(pass_, x_shape, w_shape, dtype=BF16, **buffers):
        return conv_plan.plan(pass_, x_shape, w_shape, dtype, capability, **buffers).label()

    rgb, wide, w_in, w_out = (4, 8, 8, 3), (4, 8, 8, 16), (3, 3, 3, 16), (3, 3, 16, 3)
    # by default: enc1's weight gradient and dec3's forward (the others measured slower)
    assert label("backward_weight", rgb, w_in) == "tensor_cores/cin_padded"
    assert label("forward", wide, w_out) == "tensor_cores/cout_padded"
    assert label("forward", rgb, w_in) == label("backward_input", wide, w_out) == "wide"
    monkeypatch.setattr(conv_plan, "PADDED", ALL)
    assert label("forward", rgb, w_in) == label("backward_weight", rgb, w_in) == "tensor_cores/cin_padded"
    assert label("forward", wide, w_out) == label("backward_input", wide, w_out) == "tensor_cores/cout_padded"
    assert label("backward_weight", wide, w_out) == "narrow"  # not padded (yet): conv_narrow's
    assert label("forward", rgb, w_in, dtype=np.float32) != "tensor_cores/cin_padded"
    assert label("forward", (4, 8, 8, 3), (3, 3, 3, 12)) == "wide"  # the other side no whole piece either
    need = conv_plan.plan("forward", rgb, w_in, BF16, capability).scratch
    assert need >= 4 * 8 * 8 * 8 + 9 * 8 * 16 and CONV.conv2d_scratch(rgb, w_in, BF16) >= need
    assert label("forward", rgb, w_in, scratch=need - 1) == "wide"  # a buffer too small: not padded
    assert label("backward_input", wide, w_out, flipped=False) == "wide"
    assert CONV.conv2d_scratch((2, 8, 8, 3), w_in, BF16) <= CONV.conv2d_scratch(rgb, w_in, BF16)
    monkeypatch.setattr(conv_plan, "PADDED", frozenset())
    assert label("forward", rgb, w_in) == "wide" and label("backward_weight", rgb, w_in) == "tensor_cores"
    assert CONV.conv2d_scratch(rgb, w_in, BF16) == 9 * 3 * 16  # the flipped kernel's alone


def test_a_small_buffer_takes_the_unpadded_pass(rng, mini):
    """An input gradient given a flipped buffer of KS*KS*Cin*Cout elements, a forward given none: conv_wide."""
    (dy, dyv), (w, wv) = ref.stored(rng, (1, 3, 5, 3), BF16), ref.stored(rng, (3, 3, 16, 3), BF16)
    h, hv = ref.stored(rng, (1, 3, 5, 16), BF16, RELU)
    got = ref.stored_values(run("backward_input", (dy, w, h), RELU, BF16, buffer=False))
    ref.assert_within(got, ref.conv2d_backward_input(dyv, wv, hv, RELU),
                      ref.backward_input_tolerance(dyv, wv, hv, RELU, BF16))
    (x, xv), (w, wv), (b, bv) = (ref.stored(rng, s, BF16) for s in ((1, 3, 5, 3), (3, 3, 3, 8), (8,)))
    got = ref.stored_values(run("forward", (x, w, b), RELU, BF16, buffer=False))
    ref.assert_within(got, ref.conv2d_forward(xv, wv, bv, RELU), ref.forward_tolerance(xv, wv, bv, RELU, BF16))


@pytest.mark.real_gpu
@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_production_tiles_on_awkward_shapes(rng, monkeypatch, dtype):
    """The production tiles, several blocks each way with ragged edges, every padded pass."""
    monkeypatch.setattr(conv_plan, "PADDED", ALL)
    case(rng, "forward", (3, 9, 11, 3, 152), 3, RELU, dtype, "cin")
    case(rng, "forward", (3, 9, 11, 152, 3), 3, NONE, dtype, "cout")
    case(rng, "backward_input", (3, 9, 11, 152, 3), 3, TANH, dtype, "cout")
    case(rng, "backward_weight", (3, 9, 11, 3, 152), 3, 1.0, dtype, "cin")
