"""One optimizer step of every lane of a group at once: the MLP's window as lane-axis launches.

A lane's own window (mlptrain.training.window) launches, per micro-batch, a gather, each layer's forward GEMM,
the softmax cross-entropy, each layer's weight gradient, bias gradient and input gradient; then the gradient's
sum of squares, `finish_step`, the fused update and the cursor's advance. Here each of these is one launch for
all K lanes: every operand carries the lane axis (a slab of mlptrain.packing.lane_slabs, or a lane view of one
for a layer's weights), and each lane reads its own order, cursor, step state, lr table and hyperparameters.
The lanes' activations live in buffers of their own here, one set per micro-batch size.

A lane's arithmetic is its own window's, launch for launch, except the dense GEMMs: their tile is chosen for
the K lanes' blocks together and the weight gradient is summed inside its blocks (no K split), so on a GPU a
lane's bits differ from its run alone by float32 rounding; on the CPU (BLAS either way) they are the same bits.
`active` (K,) says which lanes step: the others' cursors, step state and parameters are not touched.
"""

from __future__ import annotations

import numpy as np

from mlptrain.activation import NONE
from mlptrain.backends.lanes import lane_view
from mlptrain.optim import step_state
from mlptrain.optim.optimizers import SGD, Momentum


class LaneStep:
    """The buffers and launches of one step of K lanes of MLP sessions; `template` is one lane's session (its
    buffers are rows of `slabs`)."""

    def __init__(self, backend, slabs, template):
        self.backend, self.lanes = backend, slabs.lanes
        model, step, window = template.model, template.step, template.window
        slab = slabs.slab_of
        self.params, self.grads = slab(model.params.flat), slab(model.grads.flat)
        self.compute = self.params if model.compute is model.params else slab(model.compute.flat)
        self.widths, self.activation = model.widths, model.activation
        self.dtype = np.dtype(model.h[0].dtype)
        named = dict(zip(model.layout.names, zip(model.layout.offsets, model.layout.shapes)))
        layers = range(1, len(self.widths))
        self.weights = [(lane_view(self.compute, *named[f"fc{i}.weight"]),
                         lane_view(self.compute, *named[f"fc{i}.bias"])) for i in layers]
        self.weight_grads = [(lane_view(self.grads, *named[f"fc{i}.weight"]),
                              lane_view(self.grads, *named[f"fc{i}.bias"])) for i in layers]
        self.optimizer = step.optimizer.hparams
        self.optimizer_state = {name: slab(buf) for name, buf in step.optimizer.state.items()}
        self.state, self.partials = slab(step.state), slab(step.partials)
        self.lr_table, self.grad_norms = slab(step.lr_table), slab(step.grad_norms)
        self.loss_scale = lane_view(self.state, step_state.LOSS_SCALE, (1,))
        self.order, self.cursor = slab(window.order), slab(window.cursor)
        self.row_loss, self.row_correct = slab(window.row_loss), slab(window.row_correct)
        self.images, self.labels = window.split.images, window.split.labels
        self.scale, self.shift, self.batch_size = window.scale, window.shift, window.batch_size
        self.step_hypers = backend.zeros((self.lanes, len(step_state.LANE_HYPERS)), np.float64)
        self.optimizer_hypers = backend.zeros((self.lanes, len(step.optimizer.lane_hypers())), np.float32)
        self.active = backend.zeros((self.lanes,), np.int32)
        # how the dense GEMMs sum (the gemm launchers' ENGINES): "fma" for every K. tf32x3 (float32 on tensor
        # cores at float32 accuracy) was slower at 2, 4, 8 and 32 lanes of adam_mnist on an H100 and 7% faster at
        # 16 only (benchmarks/NOTES.md, issue 30 step 9): its tile needs many lanes to fill the GPU
        self.engine = "fma"
        self._buffers = {}

    def set_lane(self, lane: int, session) -> None:
        """Lane `lane`'s hyperparameters, from its session (a copy from the host: when a trial joins)."""
        self.backend.copy_from_host(self.step_hypers[lane], session.step.lane_hypers())
        self.backend.copy_from_host(self.optimizer_hypers[lane], session.step.optimizer.lane_hypers())

    def set_active(self, active: np.ndarray) -> None:
        self.backend.copy_from_host(self.active, np.asarray(active, np.int32))

    def _views(self, rows: int):
        """(activations, their gradients, labels) of a micro-batch of `rows` for every lane: made once."""
        if rows not in self._buffers:
            empty, lanes = self.backend.empty, self.lanes
            h = [empty((lanes, rows, w), self.dtype) for w in self.widths]
            grad = [None] + [empty((lanes, rows, w), self.dtype) for w in self.widths[1:]]
            self._buffers[rows] = (h, grad, empty((lanes, rows), np.int32))
        return self._buffers[rows]

    def launches(self, rows: int) -> None:
        """Every active lane's optimizer step over the `rows` samples at its cursor (a window of its epoch)."""
        k = self.backend.kernels
        for offset in range(0, rows, self.batch_size):
            n = min(self.batch_size, rows - offset)
            h, grad, labels = self._views(n)
            k.data.gather_lanes(self.images, self.labels, self.order, offset, h[0], labels, self.scale, self.shift,
                                self.cursor, self.active)
            self._forward(h)
            k.loss.softmax_cross_entropy_lanes(h[-1], labels, grad[-1], self.row_loss, self.row_correct, offset,
                                               1.0 / rows, self.loss_scale, self.cursor, self.active)
            self._backward(h, grad, 0.0 if offset == 0 else 1.0)
        k.reduce.sum_of_squares_lanes(self.grads, self.partials)
        k.optim.finish_step_lanes(self.partials, self.state, self.lr_table, self.grad_norms, self.step_hypers,
                                  self.active)
        self._update()
        k.data.advance_lanes(self.cursor, rows, self.active)

    def _forward(self, h) -> None:
        gemm, last = self.backend.kernels.gemm, len(self.weights) - 1
        for i, (w, b) in enumerate(self.weights):
            gemm.linear_forward(h[i], w, b, h[i + 1], NONE if i == last else self.activation, self.engine)

    def _backward(self, h, grad, beta: float) -> None:
        k = self.backend.kernels
        for i in reversed(range(len(self.weights))):
            dw, db = self.weight_grads[i]
            k.gemm.linear_backward_weight(h[i], grad[i + 1], dw, beta, engine=self.engine)
            k.reduce.bias_backward_lanes(grad[i + 1], db, beta)
            if i > 0:
                k.gemm.linear_backward_input(grad[i + 1], self.weights[i][0], h[i], grad[i], self.activation,
                                             self.engine)

    def _update(self) -> None:
        optim, state = self.backend.kernels.optim, self.optimizer_state
        args = (self.compute, self.state, self.optimizer_hypers, self.active)
        if isinstance(self.optimizer, SGD):
            optim.sgd_update_lanes(self.params, self.grads, *args)
        elif isinstance(self.optimizer, Momentum):
            optim.momentum_update_lanes(self.params, self.grads, state["velocity"], *args)
        else:
            optim.adam_update_lanes(self.params, self.grads, state["m"], state["v"], *args)
