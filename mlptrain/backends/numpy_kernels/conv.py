"""2-D convolutions as im2col + GEMM (NumPy backend).

Layout NHWC: x (N, H, W, Cin), y (N, H, W, Cout), w (KS, KS, Cin, Cout) with
KS odd, b (Cout,); stride 1, zero 'same' padding. Each pass builds the
im2col columns of a few images at a time (at most COLUMN_BYTES of them, so a
batch of 256 32x32 images with 256 channels never needs its 2.4 GB column
matrix at once) and hands them to the dense layer's NumPy GEMM, which
converts the storage formats and applies the activations exactly as for a
dense layer. Weight gradients are float32.
"""

import numpy as np

from mlptrain.backends.numpy_kernels import gemm

COLUMN_BYTES = 64 * 2**20


def _columns(x, size):
    """im2col of x (n, H, W, C): (n*H*W, size*size*C), column (dh, dw, c) of
    pixel (n, h, w) holding x[n, h + dh - P, w + dw - P, c] (zero outside)."""
    n, H, W, C = x.shape
    pad = size // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))  # zero bits are 0.0 in every storage format
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(1, 2))  # (n, H, W, C, dh, dw)
    return windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * H * W, size * size * C)


def image_chunks(x, size):
    """Slices of the batch whose im2col columns fit in COLUMN_BYTES."""
    N, H, W, C = x.shape
    per_image = H * W * size * size * C * x.itemsize
    step = max(1, COLUMN_BYTES // max(1, per_image))
    return [slice(i, min(i + step, N)) for i in range(0, N, step)]


def _rows(array):
    """An (N, H, W, C) array viewed (N*H*W, C): pixels as rows; a view (so
    writes land in the array) only when the array is C-contiguous."""
    if not array.flags.c_contiguous:
        raise ValueError(f"arrays must be C-contiguous (a batch slice buf[:n] is), got strides {array.strides}")
    return array.reshape(-1, array.shape[3])


def conv2d_forward(x, w, b, y, activation):
    """y = act(conv(x, w) + b), stride 1, zero 'same' padding."""
    size = w.shape[0]
    weight = _rows(w)
    for images in image_chunks(x, size):
        gemm.linear_forward(_columns(x[images], size), weight, b, _rows(y[images]), activation)


def flip_kernel(w, flipped):
    """flipped[(tap, cout), cin] = w[KS-1-dh, KS-1-dw, cin, cout]: the transposed convolution's kernel
    as a dense (KS*KS*Cout, Cin) matrix."""
    size, _, inputs, outputs = w.shape
    flipped[...] = w[::-1, ::-1].transpose(0, 1, 3, 2).reshape(size * size * outputs, inputs)


def conv2d_backward_input(dy, w, h, dx, activation, flipped=None):
    """dx = conv_transpose(dy, w) * act'(h): with stride 1, a convolution of
    dy with the kernel flipped in space and Cin/Cout swapped (`flipped`, the CUDA twin's buffer, is
    not used)."""
    size, _, inputs, _ = w.shape
    kernel = np.ascontiguousarray(w[::-1, ::-1].transpose(2, 0, 1, 3)).reshape(inputs, -1)  # (Cin, (tap, Cout))
    for images in image_chunks(dy, size):
        gemm.linear_backward_input(_columns(dy[images], size), kernel, _rows(h[images]), _rows(dx[images]),
                                   activation)


def conv2d_variants(x_shape, w_shape, dtype, flipped=True):
    """Every pass runs through NumPy's BLAS here."""
    return {"forward": "numpy", "backward_input": "numpy", "backward_weight": "numpy"}


def conv2d_backward_weight_workspace(x_shape, w_shape, dtype):
    """The NumPy twin sums through BLAS and needs no workspace: 0 elements."""
    return 0


def conv2d_backward_weight(x, dy, dw, beta, workspace):
    """dw = beta * dw + sum over pixels of im2col(x).T @ dy (beta 0
    overwrites, 1 accumulates); dw float32; workspace is not used."""
    size = dw.shape[0]
    weight = _rows(dw)
    if x.shape[0] == 0 and beta == 0.0:
        dw[...] = 0.0
    for chunk, images in enumerate(image_chunks(x, size)):
        gemm.linear_backward_weight(_columns(x[images], size), _rows(dy[images]), weight, beta if chunk == 0 else 1.0)
