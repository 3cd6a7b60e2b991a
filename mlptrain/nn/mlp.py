"""The MLP as a static graph over buffers allocated once.

Layer i maps h[i] (rows, widths[i]) to h[i+1] with weight fc{i+1}.weight
(widths[i], widths[i+1]) and bias fc{i+1}.bias; h[0] is the input batch and
h[-1] the logits. The backward pass writes every weight and bias gradient
with one GEMM and one column reduction each (no atomics), and the gradient of
each hidden layer with one GEMM whose epilogue applies the activation's
derivative.

Precision: parameters and their gradients are float32 flat buffers; in fp16 /
bf16 the layers compute from `compute`, a copy of the parameters in the low
format that the optimizer's update rewrites, and every activation and
activation gradient is stored in that format (in fp32 `compute` is `params`).
"""

from __future__ import annotations

import contextlib

import numpy as np

from mlptrain.activation import ACTIVATIONS, NONE
from mlptrain.dtypes import STORAGE
from mlptrain.nn.graph import StaticGraph
from mlptrain.nn.params import FlatBuffer, Layout


def mlp_layout(widths: list[int]) -> Layout:
    names, shapes = [], []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:]), start=1):
        names += [f"fc{i}.weight", f"fc{i}.bias"]
        shapes += [(fan_in, fan_out), (fan_out,)]
    return Layout(tuple(names), tuple(shapes))


class MLP(StaticGraph):
    def __init__(self, backend, in_features: int, hidden: list[int], num_classes: int,
                 activation: str, max_rows: int, precision: str = "fp32"):
        self.backend = backend
        self.widths = [in_features, *hidden, num_classes]
        self.activation = ACTIVATIONS[activation]
        self.layout = mlp_layout(self.widths)
        self.params = FlatBuffer(backend, self.layout)
        self.grads = FlatBuffer(backend, self.layout)
        dtype = STORAGE[precision]
        self.compute = self.params if precision == "fp32" else FlatBuffer(backend, self.layout, dtype)
        self.max_rows = max_rows
        # h[0] is the input; grad[i] is dLoss/dh[i] for i >= 1 (grad[-1] = dlogits)
        self.h = [backend.empty((max_rows, w), dtype) for w in self.widths]
        self.grad = [None] + [backend.empty((max_rows, w), dtype) for w in self.widths[1:]]
        self.labels = backend.empty((max_rows,), np.int32)
        # the engine of each layer's passes (on a GPU: a classifier's output layer on the narrow engine, float32
        # layers on tensor cores)
        kernels = backend.kernels
        self.engines = [kernels.gemm.layer_engines(b, dtype) for b in self.widths[1:]]
        # lets a long batch's weight and bias gradients, and a forward or input gradient of few tiles, be summed
        # in chunks by more blocks (CUDA; NumPy needs none); one pass uses it at a time
        gemm = kernels.gemm
        size = max(max(gemm.linear_backward_weight_workspace(max_rows, a, b, engine=e["backward_weight"]),
                       kernels.reduce.bias_backward_workspace(max_rows, b),
                       gemm.linear_rows_workspace(max_rows, a, b, e["forward"]),
                       gemm.linear_rows_workspace(max_rows, b, a, e["backward_input"]) if i else 0)
                   for i, (a, b, e) in enumerate(zip(self.widths[:-1], self.widths[1:], self.engines)))
        self.workspace = backend.empty((size,)) if size else None
        # the hidden layers' weight gradients' own, as they run beside the input gradients (_backward_layers)
        self.beside_workspace = backend.empty((size,)) if size and hidden else None
        # the output layer's forward and the loss as one launch where it is on the narrow engine
        self.fused_loss = self.engines[-1]["forward"] == "narrow"
        self._views = {}

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    def kernel_plan(self, rows: int) -> dict:
        """The kernel each dense layer's passes run at a batch of `rows` (the first layer computes no input
        gradient), from the backend: what summary.json records."""
        gemm, plan = self.backend.kernels.gemm, {}
        for i, (a, b) in enumerate(zip(self.widths[:-1], self.widths[1:])):
            passes = gemm.linear_variants(rows, a, b, self.workspace is not None, dtype=self.h[0].dtype)
            plan[f"fc{i + 1}"] = {p: v for p, v in passes.items() if i > 0 or p != "backward_input"}
        if self.fused_loss:
            plan[f"fc{self.num_layers}"]["forward"] += "+cross_entropy"
        return plan

    def _make_views(self, rows: int):
        """(h, grad, labels) cut to `rows`: activations, their gradients (grad[0] is None), labels."""
        return [h[:rows] for h in self.h], [None] + [g[:rows] for g in self.grad[1:]], self.labels[:rows]

    task = "classification"

    def batch(self, rows: int):
        """(input batch (rows, features), labels (rows,)): where the loader gathers a batch."""
        h, _, labels = self.views(rows)
        return h[0], labels

    def loss(self, rows: int, row_loss, row_correct, offset: int, grad_scale: float, loss_scale,
             cursor=None) -> None:
        """Per-sample cross-entropy and hits into row_loss/row_correct[cursor[0] + offset:], and its gradient
        (scaled) into dlogits."""
        h, grad, labels = self.views(rows)
        self.backend.kernels.loss.softmax_cross_entropy(h[-1], labels, grad[-1], row_loss, row_correct, offset,
                                                        grad_scale, loss_scale, cursor)

    def forward(self, rows: int):
        """Fills the logits h[-1][:rows] from the input h[0][:rows]; returns the logits view."""
        self._forward_layers(rows, self.num_layers)
        return self.views(rows)[0][-1]

    def forward_loss(self, rows: int, row_loss, row_correct, offset: int, grad_scale: float, loss_scale,
                     cursor=None) -> None:
        """`forward` then `loss`; the output layer's forward and the loss in one launch where `fused_loss`."""
        if not self.fused_loss:
            super().forward_loss(rows, row_loss, row_correct, offset, grad_scale, loss_scale, cursor)
            return
        self._fused_forward_loss(rows, row_loss, row_correct, offset, grad_scale, loss_scale, cursor, None)

    def train_pass(self, rows: int, row_loss, row_correct, offset: int, grad_scale: float, loss_scale, cursor,
                   beta: float) -> None:
        """`forward_loss` then `backward`; where the loss is fused and a hidden layer feeds the output layer, that
        layer's input gradient comes with the loss (gemm.linear_forward_cross_entropy's input_gradient), the
        same bits as backward's."""
        if not self.fused_loss or self.num_layers == 1 or self.engines[-1]["backward_input"] != "narrow":
            super().train_pass(rows, row_loss, row_correct, offset, grad_scale, loss_scale, cursor, beta)
            return
        h, grad, _ = self.views(rows)
        self._fused_forward_loss(rows, row_loss, row_correct, offset, grad_scale, loss_scale, cursor,
                                 (h[-2], grad[-2], self.activation))
        self._backward_layers(rows, beta, output_input_gradient=False)

    def _fused_forward_loss(self, rows, row_loss, row_correct, offset, grad_scale, loss_scale, cursor,
                            input_gradient) -> None:
        last = self.num_layers
        self._forward_layers(rows, last - 1)
        h, grad, labels = self.views(rows)
        self.backend.kernels.gemm.linear_forward_cross_entropy(
            h[-2], self.compute[f"fc{last}.weight"], self.compute[f"fc{last}.bias"], h[-1], labels, grad[-1],
            row_loss, row_correct, offset, grad_scale, loss_scale, cursor, input_gradient)

    def _forward_layers(self, rows: int, count: int) -> None:
        """The forward of layers 1..count: h[1..count][:rows] from h[0][:rows]."""
        gemm = self.backend.kernels.gemm
        h, _, _ = self.views(rows)
        for i in range(count):
            act = NONE if i == self.num_layers - 1 else self.activation
            gemm.linear_forward(h[i], self.compute[f"fc{i + 1}.weight"], self.compute[f"fc{i + 1}.bias"], h[i + 1], act,
                                self.engines[i]["forward"], workspace=self.workspace)

    def activations(self, rows: int, layer: int):
        """h[layer][:rows] after `forward`: 0 is the input batch, 1..num_layers-1 the hidden layers (after
        their activation), num_layers the logits."""
        return self.views(rows)[0][layer]

    def backward(self, rows: int, beta: float = 0.0) -> None:
        """From dlogits in grad[-1][:rows], writes (beta=0) or adds to (beta=1) every parameter gradient."""
        self._backward_layers(rows, beta, output_input_gradient=True)

    def _backward_layers(self, rows: int, beta: float, output_input_gradient: bool) -> None:
        """backward; without `output_input_gradient`, the output layer's input gradient (grad[-2]) is taken as
        written already (train_pass)."""
        kernels, backend = self.backend.kernels, self.backend
        h, grad, _ = self.views(rows)
        for i in reversed(range(self.num_layers)):
            # a hidden layer's weight gradient may run beside the input gradients below it, which never read it
            # (a GPU's few-block passes run side by side); the first layer's is the pass's last: in order
            with backend.beside() if i else contextlib.nullcontext():
                kernels.gemm.linear_backward_weight_bias(h[i], grad[i + 1], self.grads[f"fc{i + 1}.weight"],
                                                         self.grads[f"fc{i + 1}.bias"], beta,
                                                         self.beside_workspace if i else self.workspace,
                                                         self.engines[i]["backward_weight"])
            if i > 0 and (output_input_gradient or i < self.num_layers - 1):
                kernels.gemm.linear_backward_input(grad[i + 1], self.compute[f"fc{i + 1}.weight"], h[i], grad[i],
                                                   self.activation, self.engines[i]["backward_input"],
                                                   workspace=self.workspace)
        backend.join_beside()
