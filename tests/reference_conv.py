"""Float64 references, error bounds and shared cases for the convolution
kernels of both backends.

The references state each operation in its plainest form, independent of the
im2col formulation the kernels use: the forward pass sums shifted images
times per-tap matrices, the input gradient scatters dy back through each tap
(the adjoint, not the flipped-kernel convolution the kernels compute). Inputs
reach the kernels in a storage format (float32, float16, bf16 in uint16);
the references read back exactly the stored values.

Tolerances are worst-case bounds, not fudge factors: a float32 sum of n
products in any order is off by at most gamma_n times the sum of the terms'
absolute values (Higham, Accuracy and Stability of Numerical Algorithms,
2nd ed., 2002, section 3.1), each rounding to a storage format by at most its
unit roundoff u (plus half its subnormal spacing near zero), and tanh and
sigmoid are 1-Lipschitz, so an error in z carries to act(z) at most as is.
"""

import numpy as np

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.dtypes import from_float32
from tests.reference import activate, activation_grad, assert_within

U32 = 2.0**-24
UNIT_ROUNDOFF = {np.dtype(np.float32): U32, np.dtype(np.float16): 2.0**-11, np.dtype(np.uint16): 2.0**-8}
# Half the subnormal spacing: the most a rounding to the format is off near zero.
UNDERFLOW = {np.dtype(np.float32): 2.0**-150, np.dtype(np.float16): 2.0**-25, np.dtype(np.uint16): 2.0**-134}
# CUDA's tanhf and expf are within 2 ulp (CUDA C++ Programming Guide,
# Mathematical Functions), the sigmoid's add and divide round once each:
# 4 ulp = 8 u of the result.
SQUASH_ERROR = 8 * U32
# What one float32 addition of a sum may be off by, relative. 16-bit storage sums on tensor cores
# (conv_mma), which align and add a product block's terms with truncation, not rounding to nearest
# (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ Computer
# Science 7:e330, 2021): up to one unit in the last place, 2 u.
SUM_ROUNDOFF = {np.dtype(np.float32): U32, np.dtype(np.float16): 2 * U32, np.dtype(np.uint16): 2 * U32}
STORAGE = [np.float32, np.float16, np.uint16]


def sum_gamma(n, dtype, tf32x3=False):
    """gamma of a sum of n products in float32 from operands stored as dtype; `tf32x3`: float32 on tensor cores at
    float32 accuracy (conv_tf32), three tf32 products a term, each term within 20 u32 of its product (a split
    part truncated to tf32 is off by 2^-21 of its value, twice, and the dropped small x small is 2^-22) and the
    3n products summed with the tensor cores' truncation (2 u32 an addition): within gamma(3n + 10, 2 u32)."""
    if tf32x3:
        return gamma(3 * n + 10, 2 * U32)
    return gamma(n, SUM_ROUNDOFF[np.dtype(dtype)])


def runs_tf32x3(be, pass_, x_shape, w_shape, dtype):
    """Whether a backend's convolution pass runs on conv_tf32 (its kernel plan's label)."""
    return be.kernels.conv.conv2d_variants(x_shape, w_shape, dtype)[pass_] == "tf32x3"


def stored_values(array):
    """The float64 values an array in a storage format holds (uint16 = bf16)."""
    array = np.asarray(array)
    if array.dtype == np.uint16:
        return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return array.astype(np.float64)


def gamma(n, u=U32):
    """Relative error bound of an n-term float32 inner product, any order, each addition off by at
    most u relative."""
    return n * u / (1 - n * u)


# --- the operations ---------------------------------------------------------------


def _padded(x, size):
    pad = size // 2
    return np.pad(np.asarray(x, np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))


def convolution(x, w):
    """sum over taps (dh, dw) of x shifted by (dh - P, dw - P) times w[dh, dw]."""
    size, H, W = w.shape[0], x.shape[1], x.shape[2]
    padded, w = _padded(x, size), np.asarray(w, np.float64)
    out = np.zeros(x.shape[:3] + (w.shape[3],))
    for dh in range(size):
        for dw in range(size):
            out += padded[:, dh:dh + H, dw:dw + W, :] @ w[dh, dw]
    return out


def convolution_adjoint(dy, w):
    """The transpose of `convolution` in x: dy scattered back through each tap."""
    size, (N, H, W, _) = w.shape[0], dy.shape
    pad, dy, w = size // 2, np.asarray(dy, np.float64), np.asarray(w, np.float64)
    out = np.zeros((N, H + 2 * pad, W + 2 * pad, w.shape[2]))
    for dh in range(size):
        for dw in range(size):
            out[:, dh:dh + H, dw:dw + W, :] += dy @ w[dh, dw].T
    return out[:, pad:pad + H, pad:pad + W, :]


def weight_gradient(x, dy, size):
    """d(sum dy * convolution(x, w)) / dw, tap by tap."""
    H, W, C = x.shape[1:]
    padded, dy = _padded(x, size), np.asarray(dy, np.float64).reshape(-1, dy.shape[3])
    return np.array([[padded[:, dh:dh + H, dw:dw + W, :].reshape(-1, C).T @ dy for dw in range(size)]
                     for dh in range(size)])


def conv2d_forward(x, w, b, activation):
    return activate(convolution(x, w) + b, activation)


def conv2d_backward_input(dy, w, h, activation):
    return convolution_adjoint(dy, w) * activation_grad(h, activation)


def conv2d_backward_weight(x, dy, old, beta):
    product = weight_gradient(x, dy, old.shape[0])
    return product if beta == 0.0 else beta * np.asarray(old, np.float64) + product


# --- error bounds -----------------------------------------------------------------


def rounded(bound, value, u, tiny):
    """The error bound after rounding, with unit roundoff u, a computed value
    that was within `bound` of the exact `value`."""
    return bound + u * (np.abs(value) + bound) + tiny


def forward_tolerance(x, w, b, activation, dtype, tf32x3=False):
    """y = store(act(z)), z = sum of Cin*KS*KS products + b in float32; for
    tanh and sigmoid z is stored (rounded) before the squash, as on the GPU."""
    u, tiny = UNIT_ROUNDOFF[np.dtype(dtype)], UNDERFLOW[np.dtype(dtype)]
    z = convolution(x, w) + b
    y = activate(z, activation)
    bound = sum_gamma(np.prod(w.shape[:3]) + 1, dtype, tf32x3) * (convolution(np.abs(x), np.abs(w)) + np.abs(b))
    if activation in (TANH, SIGMOID):
        bound = rounded(bound, z, u, tiny)
        bound = rounded(bound, y, SQUASH_ERROR, 0.0)
    return rounded(bound, y, u, tiny)


def backward_input_tolerance(dy, w, h, activation, dtype, tf32x3=False):
    """dx = store(store(sum of Cout*KS*KS products) * act'(h)); act'(h) in
    float32 (1 - h*h, h*(1 - h)) is off by at most 2u32 (h^2 + |act'(h)|)."""
    u, tiny = UNIT_ROUNDOFF[np.dtype(dtype)], UNDERFLOW[np.dtype(dtype)]
    total = convolution_adjoint(dy, w)
    bound = sum_gamma(w.shape[0] * w.shape[1] * w.shape[3], dtype, tf32x3) * convolution_adjoint(np.abs(dy), np.abs(w))
    if activation == NONE:
        return rounded(bound, total, u, tiny)
    grad = activation_grad(h, activation)
    grad_error = 0.0 if activation == RELU else 2 * U32 * (np.asarray(h, np.float64) ** 2 + np.abs(grad))
    bound = rounded(bound, total, u, tiny)
    bound = bound * (np.abs(grad) + grad_error) + np.abs(total) * grad_error
    bound = rounded(bound, total * grad, U32, UNDERFLOW[np.dtype(np.float32)])
    return rounded(bound, total * grad, u, tiny)


def backward_weight_tolerance(x, dy, old, beta, dtype=np.float32, tf32x3=False):
    """dw = beta * dw + a float32 sum of N*H*W products (float32 output) of x and dy stored in dtype."""
    pixels = x.shape[0] * x.shape[1] * x.shape[2]
    terms = weight_gradient(np.abs(x), np.abs(dy), old.shape[0]) + beta * np.abs(old)
    return sum_gamma(pixels + 1, dtype, tf32x3) * terms + UNDERFLOW[np.dtype(np.float32)]


# --- cases both backends run (be: a tests.kernel_cases.Backend) ----------------------


def stored(rng, shape, dtype, activation=NONE):
    """(array in the storage format, its float64 values); with an activation,
    the array holds act(z) of a random z, as a layer's output would."""
    values = activate(rng.standard_normal(shape), activation).astype(np.float32)
    array = from_float32(values, dtype)
    return array, stored_values(array)


def poisoned(be, shape, dtype):
    """An output array of NaNs, so unwritten elements fail the comparison."""
    return be.to_device(from_float32(np.full(shape, np.nan, np.float32), dtype))


def forward_case(be, rng, shape, size, activation, dtype):
    N, H, W, cin, cout = shape
    (x, xv), (w, wv), (b, bv) = (stored(rng, s, dtype) for s in ((N, H, W, cin), (size, size, cin, cout), (cout,)))
    y = poisoned(be, (N, H, W, cout), dtype)
    be.kernels.conv.conv2d_forward(be.to_device(x), be.to_device(w), be.to_device(b), y, activation)
    got = stored_values(be.to_host(y))
    tf32x3 = runs_tf32x3(be, "forward", x.shape, w.shape, dtype)
    assert_within(got, conv2d_forward(xv, wv, bv, activation), forward_tolerance(xv, wv, bv, activation, dtype, tf32x3))


def backward_input_case(be, rng, shape, size, activation, dtype, flipped=False):
    """With `flipped`, the launcher gets a (poisoned, oversized) buffer to rearrange the kernel into."""
    N, H, W, cin, cout = shape
    (dy, dyv), (w, wv) = stored(rng, (N, H, W, cout), dtype), stored(rng, (size, size, cin, cout), dtype)
    h, hv = stored(rng, (N, H, W, cin), dtype, activation)
    dx = poisoned(be, (N, H, W, cin), dtype)
    buffer = poisoned(be, (size * size * cin * cout + 3,), dtype) if flipped else None
    be.kernels.conv.conv2d_backward_input(be.to_device(dy), be.to_device(w), be.to_device(h), dx, activation, buffer)
    got = stored_values(be.to_host(dx))
    expected = conv2d_backward_input(dyv, wv, hv, activation)
    tf32x3 = flipped and runs_tf32x3(be, "backward_input", h.shape, w.shape, dtype)
    assert_within(got, expected, backward_input_tolerance(dyv, wv, hv, activation, dtype, tf32x3))


def backward_weight_case(be, rng, shape, size, beta, dtype):
    N, H, W, cin, cout = shape
    (x, xv), (dy, dyv) = stored(rng, (N, H, W, cin), dtype), stored(rng, (N, H, W, cout), dtype)
    old = rng.standard_normal((size, size, cin, cout)).astype(np.float32)
    # beta 0 must not read dw: NaN there would leak into the result
    dw = poisoned(be, old.shape, np.float32) if beta == 0.0 else be.to_device(old)
    conv = be.kernels.conv
    workspace = be.to_device(np.full(conv.conv2d_backward_weight_workspace(x.shape, old.shape, x.dtype), np.nan, np.float32))
    conv.conv2d_backward_weight(be.to_device(x), be.to_device(dy), dw, beta, workspace)
    expected = conv2d_backward_weight(xv, dyv, old, beta)
    tf32x3 = runs_tf32x3(be, "backward_weight", x.shape, old.shape, dtype)
    assert_within(be.to_host(dw), expected, backward_weight_tolerance(xv, dyv, old, beta, dtype, tf32x3))


def bias_gradient_case(be, rng, shape, beta):
    """With NHWC, dy viewed (N*H*W, Cout) is what reduce.bias_backward sums."""
    dy = rng.standard_normal(shape).astype(np.float32)
    old = rng.standard_normal(shape[3]).astype(np.float32)
    db = be.to_device(np.full(shape[3], np.nan, np.float32)) if beta == 0.0 else be.to_device(old)
    be.kernels.reduce.bias_backward(be.to_device(dy.reshape(-1, shape[3])), db, beta)
    pixels = dy.size // shape[3]
    expected = dy.astype(np.float64).sum(axis=(0, 1, 2)) + beta * old
    bound = gamma(pixels + 1) * (np.abs(dy).sum(axis=(0, 1, 2)) + beta * np.abs(old))
    assert_within(be.to_host(db), expected, bound + UNDERFLOW[np.dtype(np.float32)])


def two_stagings_case(be, rng, pass_, shape, size, option, dtype, stagings):
    """One pass launched under each of `stagings` ((set up, expected staging) pairs: two ways of bringing a tile's
    operands in that promise the same bits, such as a cp.async ring and registers), each into a fresh output,
    asserted bitwise equal and the first checked against float64. `option`: the activation, or for the weight
    gradient beta. shape (N, H, W, cin, cout)."""
    N, H, W, cin, cout = shape
    conv = be.kernels.conv
    kernel, kernel_values = stored(rng, (size, size, cin, cout), dtype)
    tf32x3 = runs_tf32x3(be, pass_, (N, H, W, cin), kernel.shape, dtype)
    if pass_ == "forward":
        (x, xv), (b, bv) = stored(rng, (N, H, W, cin), dtype), stored(rng, (cout,), dtype)
        args = [be.to_device(a) for a in (x, kernel, b)]
        fresh = lambda: poisoned(be, (N, H, W, cout), dtype)  # noqa: E731
        launch = lambda out: conv.conv2d_forward(*args, out, option)  # noqa: E731
        expected = conv2d_forward(xv, kernel_values, bv, option)
        tolerance = forward_tolerance(xv, kernel_values, bv, option, dtype, tf32x3)
    elif pass_ == "backward_input":
        (dy, dyv), (h, hv) = stored(rng, (N, H, W, cout), dtype), stored(rng, (N, H, W, cin), dtype, option)
        args = [be.to_device(a) for a in (dy, kernel, h)]
        buffer = poisoned(be, (size * size * cin * cout,), dtype)
        fresh = lambda: poisoned(be, (N, H, W, cin), dtype)  # noqa: E731
        launch = lambda out: conv.conv2d_backward_input(*args, out, option, buffer)  # noqa: E731
        expected = conv2d_backward_input(dyv, kernel_values, hv, option)
        tolerance = backward_input_tolerance(dyv, kernel_values, hv, option, dtype, tf32x3)
    else:
        (x, xv), (dy, dyv) = stored(rng, (N, H, W, cin), dtype), stored(rng, (N, H, W, cout), dtype)
        old = rng.standard_normal((size, size, cin, cout)).astype(np.float32)
        args = [be.to_device(a) for a in (x, dy)]
        workspace = poisoned(be, (conv.conv2d_backward_weight_workspace(x.shape, old.shape, x.dtype),), np.float32)
        fresh = lambda: poisoned(be, old.shape, np.float32) if option == 0.0 else be.to_device(old)  # noqa: E731
        launch = lambda out: conv.conv2d_backward_weight(*args, out, option, workspace)  # noqa: E731
        expected = conv2d_backward_weight(xv, dyv, old, option)
        tolerance = backward_weight_tolerance(xv, dyv, old, option, dtype, tf32x3)
    results = []
    for set_up, expected_staging in stagings:
        taken = set_up()
        out = fresh()
        launch(out)
        assert taken == [expected_staging], (taken, expected_staging)
        results.append(be.to_host(out))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0].view(np.uint8), other.view(np.uint8))
    got = results[0] if pass_ == "backward_weight" else stored_values(results[0])
    assert_within(got, expected, tolerance)
