"""CUDA max pool 2x2 and nearest x2 upsample against the float64 references of
`tests.reference_pool` (the cases both backends run live there). Shapes stay tiny:
on the simulator every thread is a Python thread."""

import numpy as np
import pytest

from mlptrain.backends import numpy_kernels
from mlptrain.backends.numba_kernels import current, pool, pool_grid, pool_words
from tests import kernel_cases
from tests import reference_pool as ref

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
FORMATS = pytest.mark.parametrize("dtype", ref.STORAGE, ids=ref.STORAGE_IDS)
# odd H / W, a height of 1 (nothing to pool, all of dx zero), C of 1, 3, 33; upsampling
# writes 4x its input, so its shapes are smaller still (the simulator runs ~2000 threads/s)
SHAPES = pytest.mark.parametrize("shape", [(1, 5, 7, 3), (1, 2, 3, 33), (3, 3, 5, 1), (2, 1, 3, 3)])
UPSAMPLE_SHAPES = pytest.mark.parametrize("shape", [(1, 3, 5, 3), (1, 1, 2, 33), (3, 2, 1, 1)])
# channels filling 8-byte words (pool_words): one or two words a pixel in 16 bits, two or six in float32; odd W
WORD_SHAPES = pytest.mark.parametrize("shape", [(1, 5, 7, 4), (2, 3, 2, 12)])
WORD_UPSAMPLE_SHAPES = pytest.mark.parametrize("shape", [(1, 3, 1, 4), (2, 1, 2, 8)])


@FORMATS
def test_8_byte_words_where_the_channels_fill_them_else_elements(dtype):
    def device(shape, kind=dtype):
        return current.to_device(np.zeros(shape, kind))

    size = np.dtype(dtype).itemsize
    image, pooled = device((1, 2, 2, 4)), device((1, 1, 1, 4))
    assert pool_words.word_bytes(dtype, (image, pooled)) == 8
    assert pool_words.word_bytes(dtype, (device((1, 2, 2, 3)),)) == size
    assert pool_words.word_bytes(dtype, (device((1 + 2 * 2 * 4,))[1:].reshape(1, 2, 2, 4),)) == size  # unaligned
    argmax = device((16,), np.uint8)
    lanes = 8 // size  # argmax bytes a word
    assert pool_words.word_bytes(dtype, (image, pooled), argmax[lanes:lanes + 4].reshape(1, 1, 1, 4)) == 8
    assert pool_words.word_bytes(dtype, (image, pooled), argmax[1:5].reshape(1, 1, 1, 4)) == size


@FORMATS
@WORD_SHAPES
def test_max_pool2x2_forward_on_words(rng, shape, dtype):
    ref.pool_forward_random(BACKEND, rng, shape, dtype)
    ref.pool_forward_random(BACKEND, rng, shape, dtype, ties=True)


@FORMATS
def test_max_pool2x2_special_values_lane_by_lane(dtype):
    """Each special window in a channel of its own, so that a word's lanes hold different ones."""
    windows = ref.SPECIAL_WINDOWS
    channels = -(-len(windows) // 4) * 4
    x = np.zeros((1, 2, 2, channels), np.float32)
    for c, (values, _) in enumerate(windows):
        for (a, b), v in zip(ref.POSITIONS, values):
            x[0, a, b, c] = v
    argmax = ref.pool_forward_case(BACKEND, x, dtype)
    np.testing.assert_array_equal(argmax[0, 0, 0, :len(windows)], [k for _, k in windows])


@FORMATS
@WORD_SHAPES
def test_max_pool2x2_backward_on_words(rng, shape, dtype):
    ref.pool_backward(BACKEND, rng, shape, dtype)


@FORMATS
@WORD_UPSAMPLE_SHAPES
def test_upsample2x_on_words(rng, shape, dtype):
    ref.upsample_forward(BACKEND, rng, shape, dtype)
    got = ref.upsample_backward(BACKEND, np.random.default_rng(5), shape, dtype)
    expected = ref.upsample_backward(kernel_cases.numpy_backend(), np.random.default_rng(5), shape, dtype)
    np.testing.assert_array_equal(ref.bits(got), ref.bits(expected))


@FORMATS
@SHAPES
def test_max_pool2x2_forward(rng, shape, dtype):
    ref.pool_forward_random(BACKEND, rng, shape, dtype)


@FORMATS
def test_max_pool2x2_forward_ties(rng, dtype):
    ref.pool_forward_random(BACKEND, rng, (2, 5, 7, 3), dtype, ties=True)


@FORMATS
def test_max_pool2x2_ties_signed_zeros_infinities_and_nan(dtype):
    ref.pool_special_values(BACKEND, dtype)


@FORMATS
@SHAPES
def test_max_pool2x2_backward(rng, shape, dtype):
    ref.pool_backward(BACKEND, rng, shape, dtype)


@FORMATS
@UPSAMPLE_SHAPES
def test_upsample2x_forward(rng, shape, dtype):
    ref.upsample_forward(BACKEND, rng, shape, dtype)


@FORMATS
@UPSAMPLE_SHAPES
def test_upsample2x_backward(rng, shape, dtype):
    ref.upsample_backward(BACKEND, rng, shape, dtype)


@FORMATS
def test_upsample2x_backward_matches_the_numpy_twin_bit_for_bit(dtype):
    """Both add the four values in the same order and round once."""
    got = ref.upsample_backward(BACKEND, np.random.default_rng(5), (1, 3, 5, 3), dtype)
    expected = ref.upsample_backward(kernel_cases.numpy_backend(), np.random.default_rng(5), (1, 3, 5, 3), dtype)
    np.testing.assert_array_equal(ref.bits(got), ref.bits(expected))


def test_rows_and_columns_past_a_capped_grid_loop(rng, monkeypatch):
    """The grid's y and z limits (65535) are only reached by huge tensors; capped at 1 and 2
    here, every thread must loop over the rows and columns the grid does not cover."""
    monkeypatch.setattr(pool_grid, "MAX_GRID_Y", 1)
    monkeypatch.setattr(pool_grid, "MAX_GRID_Z", 2)
    monkeypatch.setattr(pool_grid, "THREADS", 4)
    ref.pool_forward_random(BACKEND, rng, (2, 5, 9, 3), np.float32)
    ref.pool_backward(BACKEND, rng, (2, 5, 9, 3), np.float16)
    ref.upsample_forward(BACKEND, rng, (2, 2, 3, 3), np.uint16)
    ref.upsample_backward(BACKEND, rng, (2, 3, 5, 3), np.float32)


def test_launchers_reject_bad_arguments():
    def device(shape, dtype=np.float32):
        return current.to_device(np.zeros(shape, dtype))

    x, y, argmax = device((1, 4, 4, 3)), device((1, 2, 2, 3)), device((1, 2, 2, 3), np.uint8)
    with pytest.raises(ValueError, match="argmax must be uint8"):
        pool.max_pool2x2_forward(x, y, device((1, 2, 2, 3), np.int32))
    with pytest.raises(ValueError, match="y must be float32"):
        pool.max_pool2x2_forward(x, device((1, 2, 2, 3), np.float16), argmax)
    with pytest.raises(ValueError, match="y has shape"):
        pool.max_pool2x2_forward(x, device((1, 2, 3, 3)), argmax)
    with pytest.raises(ValueError, match="x must be float32 or float16 or uint16"):
        pool.max_pool2x2_forward(device((1, 4, 4, 3), np.float64), y, argmax)
    with pytest.raises(ValueError, match="must be a device array"):
        pool.max_pool2x2_backward(np.zeros((1, 2, 2, 3), np.float32), argmax, x)
    with pytest.raises(ValueError, match="dy has shape"):
        pool.max_pool2x2_backward(device((1, 2, 3, 3)), argmax, x)
    # a strided view: refused by the launcher (numba's arrays) or never made (the driver path's take row slices only)
    with pytest.raises((ValueError, TypeError), match="C-contiguous|row slices"):
        pool.upsample2x_forward(device((1, 2, 4, 3))[:, :, ::2], device((1, 4, 4, 3)))
    with pytest.raises(ValueError, match="y has shape"):
        pool.upsample2x_forward(y, device((1, 4, 5, 3)))
    with pytest.raises(ValueError, match="dy has shape"):
        pool.upsample2x_backward(device((1, 3, 4, 3)), y)


@pytest.mark.real_gpu
@FORMATS
def test_autoencoder_sizes_match_the_numpy_twin_bit_for_bit(rng, dtype):
    """The encoder's first pool (64 x 32 x 32 x 256) and the decoder's first upsample
    (64 x 8 x 8 x 128): both backends select, copy and add in the same order."""
    numpy_backend = kernel_cases.numpy_backend()
    x, _ = ref.stored(rng.standard_normal((64, 32, 32, 256)), dtype)
    x[0, 0, 0, :4], x[0, 0, 1, 0] = np.asarray(x[0, 1, 1, :4]), np.asarray(x[0, 1, 0, 0])  # ties
    results = []
    for be in (BACKEND, numpy_backend):
        y, argmax = be.poisoned((64, 16, 16, 256), dtype=dtype), be.poisoned((64, 16, 16, 256), 7, np.uint8)
        be.kernels.pool.max_pool2x2_forward(be.to_device(x), y, argmax)
        dx = be.poisoned(x.shape, dtype=dtype)
        be.kernels.pool.max_pool2x2_backward(y, argmax, dx)
        up = be.poisoned((64, 16, 16, 128), dtype=dtype)
        be.kernels.pool.upsample2x_forward(be.to_device(np.ascontiguousarray(be.to_host(y)[:, :8, :8, :128])), up)
        back = be.poisoned((64, 8, 8, 128), dtype=dtype)
        be.kernels.pool.upsample2x_backward(up, back)
        results.append([be.to_host(a) for a in (y, argmax, dx, up, back)])
    for got, expected in zip(*results):
        np.testing.assert_array_equal(ref.bits(got), ref.bits(expected))


def test_twins_share_names_and_signatures():
    import inspect

    for name in ("max_pool2x2_forward", "max_pool2x2_backward", "upsample2x_forward", "upsample2x_backward"):
        assert inspect.signature(getattr(pool, name)) == inspect.signature(getattr(numpy_kernels.pool, name))
