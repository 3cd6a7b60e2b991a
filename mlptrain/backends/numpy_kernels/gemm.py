"""Dense layers as GEMMs with fused epilogues (NumPy backend).

Layout: x (M, K) row-major activations, w (K, N) weights, b (N,), y (M, N).
Activations and weights share one storage format (float32, float16, or bf16 in
uint16); products are computed in float32 and rounded to the format once, as
the CUDA kernels do. Weight gradients are float32. Every operand may carry a leading trial axis
(x (T, M, K), w (T, K, N), b (T, N), y (T, M, N)), as the CUDA launchers take it: np.matmul batches it.
"""

import numpy as np

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.numpy_kernels.loss import softmax_cross_entropy
from mlptrain.backends.numpy_kernels.reduce import bias_backward
from mlptrain.dtypes import from_float32, round_to_storage, to_float32

LOW_PRECISION = (np.dtype(np.float16), np.dtype(np.uint16))


def _apply_activation(y, activation):
    if activation == RELU:
        np.maximum(y, 0.0, out=y)
    elif activation == TANH:
        np.tanh(y, out=y)
    elif activation == SIGMOID:
        np.negative(y, out=y)
        with np.errstate(over="ignore"):  # exp(-z) = inf for z << 0 gives 1 / (1 + inf) = 0: exact
            np.exp(y, out=y)
        y += 1.0
        np.reciprocal(y, out=y)
    elif activation != NONE:
        raise ValueError(f"unknown activation code {activation}")


def _transposed(matrix):
    """The last two axes swapped: a layer's matrix, or each trial's."""
    return np.swapaxes(matrix, -1, -2)


def _bias(b):
    """b broadcast over each trial's rows."""
    return b[..., None, :]


def _activation_grad(h, activation):
    """d act / d z expressed through the activation's output h."""
    if activation == RELU:
        return (h > 0).astype(h.dtype)
    if activation == TANH:
        return 1.0 - h * h
    if activation == SIGMOID:
        return h * (1.0 - h)
    raise ValueError(f"unknown activation code {activation}")


ENGINES = ("fma", "tf32x3", "mma16", "narrow")  # the CUDA launchers' ways of summing; here BLAS sums every one in float32
NARROW_MOST = 16  # the CUDA narrow engine's widest layer (numba_kernels.gemm_narrow)


def _check_engine(engine, dtype, narrow_side):
    """The CUDA launchers' refusals, so that a call refused there is refused here too (`narrow_side`: the pass's
    N, which the narrow engine takes up to NARROW_MOST)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown GEMM engine {engine!r} (expected one of {ENGINES})")
    if engine == "tf32x3" and np.dtype(dtype) != np.float32:
        raise ValueError(f"the tf32x3 engine takes float32 operands, got {np.dtype(dtype)}")
    if engine == "mma16" and np.dtype(dtype) not in (np.float16, np.uint16):
        raise ValueError(f"the mma16 engine takes 16-bit operands (bf16 or fp16), got {np.dtype(dtype)}")
    if engine == "narrow" and narrow_side > NARROW_MOST:
        raise ValueError(f"the narrow engine takes layers of at most {NARROW_MOST} outputs, got {narrow_side}")


def _active_trials(active):
    """The trials an `active` mask leaves to compute."""
    return np.flatnonzero(np.asarray(active))


def linear_forward(x, w, b, y, activation, engine="fma", tiles_for=None, active=None, workspace=None):
    """y = act(x @ w + b); `engine`, `tiles_for`, `active` and `workspace` as the CUDA launcher's (BLAS sums
    either way; the workspace is not used)."""
    _check_engine(engine, x.dtype, w.shape[-1])
    if active is not None:  # each active trial as a launch of its own (the rest untouched)
        for z in _active_trials(active):
            linear_forward(x[z], w[z], b[z], y[z], activation, engine)
        return
    if y.dtype not in LOW_PRECISION:
        np.matmul(x, w, out=y)
        y += _bias(b)
        _apply_activation(y, activation)
        return
    with np.errstate(over="ignore", invalid="ignore"):  # an fp16 inf is the loss scaler's signal, not an error
        z = to_float32(x) @ to_float32(w)
        z += _bias(to_float32(b))
    if activation in (TANH, SIGMOID):  # the CUDA kernel rounds z before the squash: so do we
        z = round_to_storage(z, y.dtype)
    _apply_activation(z, activation)
    y[...] = from_float32(z, y.dtype)


def linear_forward_cross_entropy(x, w, b, logits, labels, dlogits, row_loss, row_correct, offset, grad_scale,
                                 loss_scale, cursor=None, input_gradient=None):
    """`linear_forward(x, w, b, logits, NONE, "narrow")` then `loss.softmax_cross_entropy` on its logits, as
    the CUDA launcher fuses them; given `input_gradient` (h, dx, activation), then
    `linear_backward_input(dlogits, w, h, dx, activation, "narrow")`."""
    if input_gradient is not None:  # checked before anything is written, as the CUDA launcher does
        h, dx, activation = input_gradient
        for name, array in (("h", h), ("dx", dx)):
            if array.dtype != x.dtype or array.shape != x.shape:
                raise ValueError(f"{name} must be {x.dtype} of shape {x.shape}, got {array.dtype} {array.shape}")
    linear_forward(x, w, b, logits, NONE, "narrow")
    softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale, loss_scale, cursor)
    if input_gradient is not None:
        linear_backward_input(dlogits, w, h, dx, activation, "narrow")


def linear_backward_input(dy, w, h, dx, activation, engine="fma", tiles_for=None, active=None, workspace=None):
    """dx = (dy @ w.T) * act'(h), where h = act(z) is this layer's input; the workspace is not used."""
    _check_engine(engine, dy.dtype, dy.shape[-1])
    if active is not None:
        for z in _active_trials(active):
            linear_backward_input(dy[z], w[z], h[z], dx[z], activation, engine)
        return
    if dx.dtype not in LOW_PRECISION:
        np.matmul(dy, _transposed(w), out=dx)
        if activation != NONE:
            dx *= _activation_grad(h, activation)
        return
    with np.errstate(over="ignore", invalid="ignore"):  # an fp16 inf is the loss scaler's signal, not an error
        grad = to_float32(dy) @ _transposed(to_float32(w))
    if activation != NONE:  # the CUDA kernel rounds the product before the activation's derivative
        grad = round_to_storage(grad, dx.dtype) * _activation_grad(to_float32(h), activation)
    dx[...] = from_float32(grad, dx.dtype)


def linear_backward_weight_workspace(batch, inputs, outputs, trials=None, engine="fma"):
    """The NumPy twin sums through BLAS and needs no workspace: 0 elements."""
    return 0


def linear_rows_workspace(rows, summed, outputs, engine="fma"):
    """BLAS needs none."""
    return 0


def tensor_cores():
    """BLAS sums every pass here: no tensor-core engine runs."""
    return False


def layer_engines(outputs, dtype):
    """The engine a run's own dense layer passes to the launchers: BLAS sums every pass, so "fma" (a name the
    launchers check and then ignore)."""
    return {"forward": "fma", "backward_input": "fma", "backward_weight": "fma"}


def linear_backward_weight_bias(x, dy, dw, db, beta, workspace=None, engine="fma", tiles_for=None, active=None):
    """`linear_backward_weight` then `reduce.bias_backward`, as the CUDA launcher groups them; with `active`
    (a leading trial axis), each active trial's."""
    if active is not None:
        for z in _active_trials(active):
            linear_backward_weight_bias(x[z], dy[z], dw[z], db[z], beta, engine=engine)
        return
    linear_backward_weight(x, dy, dw, beta, workspace, engine)
    bias_backward(dy, db, beta, workspace)


def linear_variants(rows, inputs, outputs, workspace=True, trials=None, dtype="float32"):
    """Every pass runs through NumPy's BLAS here."""
    return {"forward": "numpy", "backward_input": "numpy", "backward_weight": "numpy"}


def linear_backward_weight(x, dy, dw, beta, workspace=None, engine="fma", tiles_for=None, active=None):
    """dw = beta * dw + x.T @ dy (beta 0 overwrites, 1 accumulates); dw float32; workspace is not used."""
    _check_engine(engine, x.dtype, dy.shape[-1])
    if active is not None:
        for z in _active_trials(active):
            linear_backward_weight(x[z], dy[z], dw[z], beta, engine=engine)
        return
    x, dy = to_float32(x), to_float32(dy)
    with np.errstate(over="ignore", invalid="ignore"):  # an fp16 inf is the loss scaler's signal, not an error
        if beta == 0.0:
            np.matmul(_transposed(x), dy, out=dw)
        else:
            dw *= beta
            dw += _transposed(x) @ dy
