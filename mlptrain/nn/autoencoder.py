"""The convolutional autoencoder as a static graph over buffers allocated once.

NHWC throughout. With channels [c1, ..., cL] and kernel size k:

    encoder  conv k x k 3 -> c1 + ReLU, maxpool 2x2, ..., conv c(L-1) -> cL + ReLU, maxpool 2x2  (the latent)
    decoder  conv cL -> cL + ReLU, upsample x2, conv cL -> c(L-1) + ReLU, upsample x2, ..., conv c1 -> 3

so [256, 128] on 32 x 32 images is the 8 x 8 x 128 = 8,192-d latent of the
seeds. The loss is the MSE between the reconstruction and the input batch
(pixels / 255). Backward passes need no atomics: each convolution writes its
weight gradient by a two-pass deterministic reduction, its bias gradient by a
column reduction and its input gradient (times ReLU' of that input) by the
thread owning each element; pooling routes gradients through the recorded
argmax, upsampling sums its four copies.

ReLU' is applied to the gradient of a pooled or upsampled tensor before
routing it back: a 2x2 max-pool passes the gradient only to its argmax, whose
value is the pooled value, and an upsample copies the value, so the mask of
the routed tensor equals the mask of its source.
"""

from __future__ import annotations

import math

import numpy as np

from mlptrain.activation import NONE, RELU
from mlptrain.dtypes import STORAGE
from mlptrain.nn.graph import StaticGraph
from mlptrain.nn.params import FlatBuffer, Layout


def autoencoder_convs(channels: list[int], image_channels: int = 3) -> list[tuple[int, int]]:
    """(in, out) channels of every convolution, encoder then decoder."""
    widths = [image_channels, *channels]
    encoder = list(zip(widths[:-1], widths[1:]))
    reverse = channels[::-1]
    decoder = list(zip([reverse[0], *reverse[:-1]], reverse)) + [(reverse[-1], image_channels)]
    return encoder + decoder


class ConvAutoencoder(StaticGraph):
    task = "reconstruction"

    def __init__(self, backend, image_shape: tuple[int, int, int], channels: list[int], kernel_size: int,
                 max_rows: int, precision: str = "fp32"):
        """image_shape is (H, W, C); H and W must be divisible by 2 ** len(channels)."""
        self.backend = backend
        self.height, self.width, self.image_channels = image_shape
        self.depth = len(channels)
        self.kernel_size = kernel_size
        self.convs = autoencoder_convs(list(channels), self.image_channels)
        names, shapes = [], []
        for i, (cin, cout) in enumerate(self.convs, start=1):
            names += [f"conv{i}.weight", f"conv{i}.bias"]
            shapes += [(kernel_size, kernel_size, cin, cout), (cout,)]
        self.layout = Layout(tuple(names), tuple(shapes))
        self.params = FlatBuffer(backend, self.layout)
        self.grads = FlatBuffer(backend, self.layout)
        dtype = STORAGE[precision]
        self.compute = self.params if precision == "fp32" else FlatBuffer(backend, self.layout, dtype)
        self.max_rows = max_rows
        self.num_features = self.height * self.width * self.image_channels
        self.labels = backend.empty((max_rows,), np.int32)  # gathered with the images, unused by the loss
        # Per convolution i: its input a[i] (conv output for i = last), z-side output out[i] (pre-pool /
        # pre-upsample, after ReLU), and the gradients of both. a[0] is the input batch.
        self.sizes = self._spatial_sizes()
        self.inputs, self.outputs, self.argmax = [], [], []
        for i, (cin, cout) in enumerate(self.convs):
            (h, w), _ = self.sizes[i]
            self.inputs.append(backend.empty((max_rows, h, w, cin), dtype))
            self.outputs.append(backend.empty((max_rows, h, w, cout), dtype))
            if i < self.depth:
                self.argmax.append(backend.empty((max_rows, h // 2, w // 2, cout), np.uint8))
        self.input_grads = [backend.empty(a.shape, dtype) for a in self.inputs]
        self.output_grads = [backend.empty(z.shape, dtype) for z in self.outputs]
        conv = backend.kernels.conv
        bias = backend.kernels.reduce.bias_backward_workspace
        workspace = max(max(conv.conv2d_backward_weight_workspace((max_rows, *self.sizes[i][0], cin),
                                                                  (kernel_size, kernel_size, cin, cout), dtype),
                            bias(max_rows * math.prod(self.sizes[i][0]), cout))
                        for i, (cin, cout) in enumerate(self.convs))
        self.workspace = backend.empty((max(workspace, 1),))
        # the input gradients read each kernel rearranged into this, as a dense matrix; a side of few channels (the
        # RGB image and output) is padded into it first on the GPU
        self.scratch = backend.empty((max(conv.conv2d_scratch((max_rows, *self.sizes[i][0], cin),
                                                              (kernel_size, kernel_size, cin, cout), dtype)
                                          for i, (cin, cout) in enumerate(self.convs)),), dtype)
        self._views = {}

    def kernel_plan(self, rows: int) -> dict:
        """The kernel variant each convolution's passes run at a batch of `rows` (the first layer computes no
        input gradient), from the backend's plan: what summary.json records."""
        conv, dtype = self.backend.kernels.conv, self.compute.flat.dtype
        plan = {}
        for i, (cin, cout) in enumerate(self.convs):
            (h, w), _ = self.sizes[i]
            shape = (self.kernel_size, self.kernel_size, cin, cout)
            passes = conv.conv2d_variants((rows, h, w, cin), shape, dtype)
            plan[f"conv{i + 1}"] = {p: v for p, v in passes.items() if i > 0 or p != "backward_input"}
        return plan

    def _spatial_sizes(self):
        """((H, W) of convolution i's input and output, what follows it: 'pool', 'upsample' or None)."""
        sizes, h, w = [], self.height, self.width
        for i in range(len(self.convs)):
            if i < self.depth:
                sizes.append(((h, w), "pool"))
                if h % 2 or w % 2:
                    raise ValueError(f"images of {self.height}x{self.width} cannot be max-pooled "
                                     f"{self.depth} times")
                h, w = h // 2, w // 2
            elif i < len(self.convs) - 1:
                sizes.append(((h, w), "upsample"))
                h, w = h * 2, w * 2
            else:
                sizes.append(((h, w), None))
        return sizes

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        (h, w), _ = self.sizes[self.depth]
        return h, w, self.convs[self.depth - 1][1]

    def _make_views(self, rows: int):
        """(inputs, outputs, argmax, input_grads, output_grads) of every convolution, cut to `rows`."""
        def cut(arrays):
            return [a[:rows] for a in arrays]

        return cut(self.inputs), cut(self.outputs), cut(self.argmax), cut(self.input_grads), cut(self.output_grads)

    def batch(self, rows: int):
        """(input batch (rows, H*W*C), labels (rows,)): where the loader gathers a batch."""
        inputs = self.views(rows)[0]
        return inputs[0].reshape(rows, self.num_features), self.labels[:rows]

    def reconstruction(self, rows: int):
        """The decoder's output (rows, H*W*C) after `forward`."""
        return self.views(rows)[1][-1].reshape(rows, self.num_features)

    def latent(self, rows: int):
        """The encoder's output (rows, h, w, c) after `encode` or `forward`."""
        inputs = self.views(rows)[0]
        return inputs[self.depth]

    def encode(self, rows: int) -> None:
        self._run(rows, range(self.depth))

    def forward(self, rows: int) -> None:
        """Input batch -> reconstruction."""
        self._run(rows, range(len(self.convs)))

    def _run(self, rows, layers):
        k = self.backend.kernels
        inputs, outputs, argmax, _, _ = self.views(rows)
        for i in layers:
            last = i == len(self.convs) - 1
            k.conv.conv2d_forward(inputs[i], self.compute[f"conv{i + 1}.weight"], self.compute[f"conv{i + 1}.bias"],
                                  outputs[i], NONE if last else RELU, self.scratch)
            follow = self.sizes[i][1]
            if follow == "pool":
                k.pool.max_pool2x2_forward(outputs[i], inputs[i + 1], argmax[i])
            elif follow == "upsample":
                k.pool.upsample2x_forward(outputs[i], inputs[i + 1])

    def loss(self, rows: int, row_loss, row_correct, offset: int, grad_scale: float, loss_scale,
             cursor=None) -> None:
        """Per-sample MSE of the reconstruction into row_loss[cursor[0] + offset:], and its gradient (scaled)
        into the reconstruction's gradient buffer. row_correct is not written: there is no accuracy."""
        _, _, _, _, output_grads = self.views(rows)
        x, _ = self.batch(rows)
        self.backend.kernels.loss.mse(self.reconstruction(rows), x, output_grads[-1].reshape(rows, self.num_features),
                                      row_loss, offset, grad_scale, loss_scale, cursor)

    def backward(self, rows: int, beta: float = 0.0) -> None:
        """From the reconstruction's gradient, writes (beta=0) or adds to (beta=1) every parameter gradient."""
        k = self.backend.kernels
        inputs, outputs, argmax, input_grads, output_grads = self.views(rows)
        for i in reversed(range(len(self.convs))):
            dz = output_grads[i]
            (h, w), _ = self.sizes[i]
            k.conv.conv2d_backward_weight(inputs[i], dz, self.grads[f"conv{i + 1}.weight"], beta, self.workspace)
            k.reduce.bias_backward(dz.reshape(rows * h * w, dz.shape[3]), self.grads[f"conv{i + 1}.bias"], beta,
                                   self.workspace)
            if i == 0:
                break
            k.conv.conv2d_backward_input(dz, self.compute[f"conv{i + 1}.weight"], inputs[i], input_grads[i], RELU,
                                         self.scratch)
            if self.sizes[i - 1][1] == "pool":
                k.pool.max_pool2x2_backward(input_grads[i], argmax[i - 1], output_grads[i - 1])
            else:
                k.pool.upsample2x_backward(input_grads[i], output_grads[i - 1])
