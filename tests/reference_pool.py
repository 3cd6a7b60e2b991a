"""Float64 references, error bounds and shared cases for the pooling,
upsampling and MSE kernels of both backends.

The references loop over windows and elements in the plainest way, from the
values the stored inputs hold. Pool forward and backward and upsample forward
select or copy stored values: the kernels must match them bit for bit. Where a
kernel rounds, the tolerance is a worst-case bound: a float32 sum of n terms
in any order is off by at most gamma(n-1) times the sum of the terms' absolute
values, n float32 roundings of a product by gamma(n) relative (Higham,
Accuracy and Stability of Numerical Algorithms, 2nd ed., 2002, sections 3.1
and 3.4), and each rounding to a storage format by its unit roundoff u plus
half its subnormal spacing near zero.
"""

import numpy as np

from mlptrain.dtypes import from_float32, to_float32
from tests.reference import assert_within

POSITIONS = ((0, 0), (0, 1), (1, 0), (1, 1))  # window position k = 2 * row + column
U32 = 2.0**-24
UNIT_ROUNDOFF = {np.dtype(np.float32): U32, np.dtype(np.float16): 2.0**-11, np.dtype(np.uint16): 2.0**-8}
UNDERFLOW = {np.dtype(np.float32): 2.0**-150, np.dtype(np.float16): 2.0**-25, np.dtype(np.uint16): 2.0**-134}
STORAGE = [np.float32, np.float16, np.uint16]
STORAGE_IDS = ["fp32", "fp16", "bf16"]


def gamma(n):
    return n * U32 / (1 - n * U32)


# --- the operations ----------------------------------------------------------------


def max_pool2x2(x):
    """(y, argmax): for each window, the first NaN if there is one, else the first maximum."""
    x = np.asarray(x, np.float64)
    N, H, W, C = x.shape
    y, argmax = np.empty((N, H // 2, W // 2, C)), np.empty((N, H // 2, W // 2, C), np.uint8)
    for n, i, j, c in np.ndindex(y.shape):
        window = [x[n, 2 * i + a, 2 * j + b, c] for a, b in POSITIONS]
        nans = [k for k, v in enumerate(window) if np.isnan(v)]
        argmax[n, i, j, c] = nans[0] if nans else window.index(max(window))
        y[n, i, j, c] = window[argmax[n, i, j, c]]
    return y, argmax


def max_pool2x2_backward(dy, argmax, shape):
    """dx of `shape`: each dy goes to its window's winner, every other element is 0."""
    dx = np.zeros(shape)
    for n, i, j, c in np.ndindex(dy.shape):
        a, b = POSITIONS[argmax[n, i, j, c]]
        dx[n, 2 * i + a, 2 * j + b, c] = dy[n, i, j, c]
    return dx


def upsample2x(x):
    return np.repeat(np.repeat(np.asarray(x, np.float64), 2, axis=1), 2, axis=2)


def upsample2x_backward(dy):
    """The adjoint of upsample2x: each input sums the four outputs it was copied to."""
    N, H2, W2, C = dy.shape
    return np.asarray(dy, np.float64).reshape(N, H2 // 2, 2, W2 // 2, 2, C).sum(axis=(2, 4))


def mse(output, target, grad_scale):
    """(row_loss, doutput): the mean of squares per row and its gradient times grad_scale."""
    diff = np.asarray(output, np.float64) - np.asarray(target, np.float64)
    return (diff**2).mean(axis=1), 2.0 * diff / diff.shape[1] * grad_scale


# --- error bounds ------------------------------------------------------------------


def upsample2x_backward_tolerance(dy, dtype):
    """Three float32 additions, then one rounding to the storage format."""
    u, tiny = UNIT_ROUNDOFF[np.dtype(dtype)], UNDERFLOW[np.dtype(dtype)]
    magnitude = upsample2x_backward(np.abs(dy))
    return u * np.abs(upsample2x_backward(dy)) + (1 + u) * gamma(3) * magnitude + tiny


def mse_loss_tolerance(output, target):
    """Each square is off by 3 roundings at most (the difference, the product, the
    sum's), D terms summed, one division: gamma(D + 3) of the (nonnegative) loss."""
    loss, _ = mse(output, target, 1.0)
    return gamma(output.shape[1] + 3) * loss + UNDERFLOW[np.dtype(np.float32)]


def mse_gradient_tolerance(expected, dtype):
    """difference, 2 / D * grad_scale, the loss scale's float32, their product and
    the gradient's: 5 float32 roundings (plus float64's, counted as a sixth), then one
    rounding to the storage format."""
    u, tiny = UNIT_ROUNDOFF[np.dtype(dtype)], UNDERFLOW[np.dtype(dtype)]
    magnitude = np.abs(expected)
    return (u + (1 + u) * gamma(6)) * magnitude + tiny + UNDERFLOW[np.dtype(np.float32)]


# --- cases both backends run (be: a tests.kernel_cases.Backend) ----------------------


def stored(values, dtype):
    """(array in the storage format, the float64 values it holds)."""
    array = from_float32(np.asarray(values, np.float32), dtype)
    return array, to_float32(array).astype(np.float64)


def bits(array):
    """The raw bit patterns of a stored array, to compare selections and copies exactly."""
    array = np.asarray(array)
    return array.view(np.uint32 if array.itemsize == 4 else np.uint16)


def assert_same_bits(got, expected_values, dtype):
    """got (stored) holds exactly expected_values (NaN-free, representable in dtype)."""
    np.testing.assert_array_equal(bits(got), bits(from_float32(np.asarray(expected_values, np.float32), dtype)))


def pool_forward_case(be, x, dtype):
    """x: float32 values, stored in dtype first; both outputs must match the reference
    exactly (y bit for bit, a NaN as any NaN). Returns the kernel's argmax."""
    x, xv = stored(x, dtype)
    N, H, W, C = x.shape
    y, argmax = be.poisoned((N, H // 2, W // 2, C), dtype=dtype), be.poisoned((N, H // 2, W // 2, C), 7, np.uint8)
    be.kernels.pool.max_pool2x2_forward(be.to_device(x), y, argmax)
    expected_y, expected_argmax = max_pool2x2(xv)
    np.testing.assert_array_equal(be.to_host(argmax), expected_argmax)
    nan = np.isnan(expected_y)
    assert np.isnan(to_float32(be.to_host(y))[nan]).all()
    assert_same_bits(be.to_host(y)[~nan], expected_y[~nan], dtype)
    return be.to_host(argmax)


def pool_forward_random(be, rng, shape, dtype, ties=False):
    """Normal values, or small integers (exact in every format) so most windows hold ties."""
    x = rng.integers(-2, 3, shape) if ties else rng.standard_normal(shape)
    pool_forward_case(be, x.astype(np.float32), dtype)


# One window per entry: its four values in position order, and the position that must win.
SPECIAL_WINDOWS = [
    ([1, 3, 3, 0], 1),  # tie: the first maximum
    ([2, 2, 2, 2], 0),
    ([0, 5, 1, 5], 1),
    ([-0.0, 0.0, -1, -2], 0),  # -0 == +0: the first, and its sign bit, is kept
    ([0.0, -0.0, -1, -2], 0),
    ([1, np.nan, 2, np.nan], 1),  # NaN beats every number; the first NaN wins
    ([np.inf, 1, np.nan, 2], 2),
    ([np.nan, np.inf, 3, 4], 0),
    ([-np.inf, -np.inf, -np.inf, -np.inf], 0),
    ([1, 2, 3, np.inf], 3),
    ([-7, -3, -5, -4], 1),
]


def pool_special_values(be, dtype):
    """Windows laid side by side in a (1, 2, 2 * windows, 1) image."""
    x = np.empty((1, 2, 2 * len(SPECIAL_WINDOWS), 1), np.float32)
    for w, (values, _) in enumerate(SPECIAL_WINDOWS):
        for (a, b), v in zip(POSITIONS, values):
            x[0, a, 2 * w + b, 0] = v
    argmax = pool_forward_case(be, x, dtype)
    np.testing.assert_array_equal(argmax[0, 0, :, 0], [k for _, k in SPECIAL_WINDOWS])


def pool_backward(be, rng, shape, dtype):
    """Random argmax (not necessarily from a forward pass): dx must hold dy at each
    window's winner and +0 everywhere else, the odd trailing row and column included."""
    N, H, W, C = shape
    out = (N, H // 2, W // 2, C)
    dy, dyv = stored(rng.standard_normal(out), dtype)
    argmax = rng.integers(0, 4, out).astype(np.uint8)
    dx = be.poisoned(shape, dtype=dtype)
    be.kernels.pool.max_pool2x2_backward(be.to_device(dy), be.to_device(argmax), dx)
    got = be.to_host(dx)
    assert_same_bits(got, max_pool2x2_backward(dyv, argmax, shape), dtype)
    assert not bits(got[:, 2 * (H // 2):]).any() and not bits(got[:, :, 2 * (W // 2):]).any()


def upsample_forward(be, rng, shape, dtype):
    x, xv = stored(rng.standard_normal(shape), dtype)
    N, H, W, C = shape
    y = be.poisoned((N, 2 * H, 2 * W, C), dtype=dtype)
    be.kernels.pool.upsample2x_forward(be.to_device(x), y)
    assert_same_bits(be.to_host(y), upsample2x(xv), dtype)


def upsample_backward(be, rng, shape, dtype):
    """shape is dx's; dy is (N, 2H, 2W, C)."""
    N, H, W, C = shape
    dy, dyv = stored(rng.standard_normal((N, 2 * H, 2 * W, C)), dtype)
    dx = be.poisoned(shape, dtype=dtype)
    be.kernels.pool.upsample2x_backward(be.to_device(dy), dx)
    got = to_float32(be.to_host(dx))
    assert_within(got, upsample2x_backward(dyv), upsample2x_backward_tolerance(dyv, dtype))
    return be.to_host(dx)


def mse_run(be, output, target, offset=0, extra=3, grad_scale=1.0, loss_scale=1.0):
    """(doutput, row_loss) from poisoned outputs; row_loss has `extra` spare slots after the rows."""
    rows, width = output.shape
    doutput = be.poisoned((rows, width), dtype=output.dtype)
    row_loss = be.poisoned(offset + rows + extra)
    be.kernels.loss.mse(be.to_device(output), be.to_device(target), doutput, row_loss, offset, grad_scale,
                        be.to_device(np.array([loss_scale])))
    return be.to_host(doutput), be.to_host(row_loss)


def mse_case(be, rng, rows, width, dtype, grad_scale, loss_scale=1.0, offset=2):
    (output, ov), (target, tv) = (stored(rng.standard_normal((rows, width)), dtype) for _ in range(2))
    doutput, row_loss = mse_run(be, output, target, offset, 3, grad_scale, loss_scale)
    expected_loss, expected_grad = mse(ov, tv, grad_scale * loss_scale)
    assert_within(row_loss[offset:offset + rows], expected_loss, mse_loss_tolerance(ov, tv))
    assert np.isnan(row_loss[:offset]).all() and np.isnan(row_loss[offset + rows:]).all()
    assert_within(to_float32(doutput), expected_grad, mse_gradient_tolerance(expected_grad, dtype))
    return doutput


def mse_rejects_rows_that_do_not_fit(be, rng):
    output = rng.standard_normal((4, 5)).astype(np.float32)
    for offset, slots in ((-1, 8), (5, 8), (0, 3)):
        row_loss = be.poisoned(slots)
        try:
            be.kernels.loss.mse(be.to_device(output), be.to_device(output), be.to_device(output), row_loss, offset,
                                1.0, be.to_device(np.ones(1)))
        except ValueError as error:
            assert "do not fit" in str(error)
        else:
            raise AssertionError(f"offset {offset} with {slots} slots was accepted")
        assert np.isnan(be.to_host(row_loss)).all()
