"""2x2 max pooling and nearest x2 upsampling, forward and backward (NumPy backend).

Layout NHWC; one storage format per call (float32, float16, or bf16 in
uint16), argmax in uint8. The same rules as the CUDA kernels: window position
k = 2 * row + column; the first maximum wins ties and the first NaN beats any
number (np.argmax's rule); odd sizes take the floor; selections and copies
move stored bits unchanged; upsample backward adds in float32 in the order
(0,0) (0,1) (1,0) (1,1) and rounds once, so it matches the GPU bit for bit.
"""

import numpy as np

from mlptrain.dtypes import from_float32, to_float32

POSITIONS = ((0, 0), (0, 1), (1, 0), (1, 1))  # (row, column) of window position k


def _window_views(array, out_h, out_w):
    """The four strided views array[:, a::2, b::2] cut to (out_h, out_w), in position order."""
    return [array[:, a:2 * out_h:2, b:2 * out_w:2] for a, b in POSITIONS]


def max_pool2x2_forward(x, y, argmax):
    """y[n, i, j, c] = max of x[n, 2i:2i+2, 2j:2j+2, c]; argmax = the winner's position (0..3)."""
    stored = np.stack(_window_views(x, y.shape[1], y.shape[2]), axis=-1)
    winner = np.argmax(to_float32(stored), axis=-1)
    y[...] = np.take_along_axis(stored, winner[..., None], axis=-1)[..., 0]
    argmax[...] = winner


def max_pool2x2_backward(dy, argmax, dx):
    """dx[n, h, w, c] = dy[n, h//2, w//2, c] where (h, w) was its window's argmax, else 0."""
    dx[...] = 0  # +0 in every storage format; the odd trailing row / column keeps it
    zero = np.zeros((), dx.dtype)
    for k, view in enumerate(_window_views(dx, dy.shape[1], dy.shape[2])):
        view[...] = np.where(argmax == k, dy, zero)


def upsample2x_forward(x, y):
    """y[n, h, w, c] = x[n, h // 2, w // 2, c]."""
    for view in _window_views(y, x.shape[1], x.shape[2]):
        view[...] = x


def upsample2x_backward(dy, dx):
    """dx[n, h, w, c] = the sum of dy[n, 2h:2h+2, 2w:2w+2, c] in float32, rounded once."""
    first, second, third, fourth = (to_float32(view) for view in _window_views(dy, dx.shape[1], dx.shape[2]))
    total = first + second
    total += third
    total += fourth
    dx[...] = from_float32(total, dx.dtype)
