"""2-D convolutions as im2col + GEMM (NumPy backend).

Layout NHWC: x (N, H, W, Cin), y (N, H, W, Cout), w (KS, KS, Cin, Cout) with
KS odd, b (Cout,); stride 1, zero 'same' padding. Each pass builds the
im2col columns of a few images at a time (at most im2col.COLUMN_BYTES of them, so a
batch of 256 32x32 images with 256 channels never needs its 2.4 GB column
matrix at once) and hands them to the dense layer's NumPy GEMM, which
converts the storage formats and applies the activations exactly as for a
dense layer. Weight gradients are float32.
"""

import numpy as np

from mlptrain.backends.numpy_kernels import gemm
from mlptrain.backends.numpy_kernels.im2col import image_chunks, image_columns, pixel_rows


def conv2d_forward(x, w, b, y, activation, scratch=None):
    """y = act(conv(x, w) + b), stride 1, zero 'same' padding (`scratch`, the CUDA twin's buffer, is not used)."""
    size = w.shape[0]
    weight = pixel_rows(w)
    for images in image_chunks(x, size):
        gemm.linear_forward(image_columns(x[images], size), weight, b, pixel_rows(y[images]), activation)


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
        gemm.linear_backward_input(image_columns(dy[images], size), kernel, pixel_rows(h[images]),
                                   pixel_rows(dx[images]), activation)


def conv2d_variants(x_shape, w_shape, dtype, flipped=True):
    """Every pass runs through NumPy's BLAS here."""
    return {"forward": "numpy", "backward_input": "numpy", "backward_weight": "numpy"}


def conv2d_scratch(x_shape, w_shape, dtype):
    """The CUDA twin's scratch buffer for the flipped kernel: KS * KS * Cin * Cout elements (not used here)."""
    return int(np.prod(w_shape))


def conv2d_backward_weight_workspace(x_shape, w_shape, dtype):
    """The NumPy twin sums through BLAS and needs no workspace: 0 elements."""
    return 0


def conv2d_backward_weight(x, dy, dw, beta, workspace):
    """dw = beta * dw + sum over pixels of im2col(x).T @ dy (beta 0
    overwrites, 1 accumulates); dw float32; workspace is not used."""
    size = dw.shape[0]
    weight = pixel_rows(dw)
    if x.shape[0] == 0 and beta == 0.0:
        dw[...] = 0.0
    for chunk, images in enumerate(image_chunks(x, size)):
        gemm.linear_backward_weight(image_columns(x[images], size), pixel_rows(dy[images]), weight,
                                    beta if chunk == 0 else 1.0)
