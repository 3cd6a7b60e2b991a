"""One optimizer step of every lane of a group at once: the MLP's window as lane-axis launches.

A lane's own window (mlptrain.training.window) launches, per micro-batch, a gather, each layer's forward GEMM,
the softmax cross-entropy, each layer's weight gradient, bias gradient and input gradient; then the gradient's
sum of squares, `finish_step`, the fused update and the cursor's advance (Adam's without clipping or loss
scaling: the update, preparing its own rules and summing the squares, then `record_norm`). Here each of these is
one launch for all K lanes (the lanes' rules prepared in `finish_step_lanes`' launch, before the update; the
cursors moved on in the last rules launch): every operand carries the lane axis (a slab of
mlptrain.packing.lane_slabs, or a lane view of one for a layer's weights), and each lane reads its own order,
cursor, step state, lr table and hyperparameters. A hidden layer's weight and bias gradients (one launch where
gemm_weight groups them) run beside the input gradients below it, as a run's own (CudaBackend.beside).
The lanes' activations live in buffers of their own here, one set per micro-batch size.

A lane's arithmetic is its own window's, launch for launch, except the dense GEMMs: their tile is chosen for
the launched lanes' blocks together (for all K with `tiles_for`, as a staggered group needs: mlptrain.packing.
lane_group), the weight gradient is summed inside its blocks (no K split), and a float32 group of TF32_LANES or
more sums them on the tf32x3 engine (a layer of 16 outputs or fewer on the narrow one), so on a GPU a lane's bits
differ from its run alone by float32 rounding;
on the CPU (BLAS either way) they are its run's bits alone.
`active` (K,) says which lanes step: the others' cursors, step state and parameters are not touched, and their
GEMM blocks return at once (a lane between epochs costs the others almost nothing).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np

from mlptrain.activation import NONE
from mlptrain.backends.lanes import lane_view
from mlptrain.optim import step_state
from mlptrain.optim.optimizers import SGD, Momentum

TF32_LANES = 16  # lanes from which a float32 group's GEMMs run on the tf32x3 engine
# The engines whose groups update the hidden layers in their weight gradients' epilogue (_epilogue_update): none.
# Correct (the parameters' bits of the update apart), but 16 adam_mnist lanes' step took 332 µs with fc1 and fc2
# fused against 292 apart: each fused launch ran as long as its weight gradient and its share of the update apart
# (fc1 96 µs, fc2 70), and fc2's no longer ran beside fc2's input gradient (H200; benchmarks/NOTES.md, issue 30
# step 32). ("tf32x3",) turns it on.
EPILOGUE_UPDATE = ()
# tf32x3 has one tile and no K split: an output of few tiles sums its long K in few blocks. An output layer's
# forward (128 x 10, K = 512) took 44 µs for 16 lanes on it against 19 on "fma"'s K-split tiles (ncu, H200;
# benchmarks/NOTES.md, issue 30 step 13), where outputs of 128 tiles or more ran 1.3-1.7x faster on it
TF32_MIN_BLOCKS = 128


def tf32x3_fills(M: int, N: int, lanes: int, tile: tuple) -> bool:
    """Whether `lanes` M x N outputs make TF32_MIN_BLOCKS or more of the tf32x3 engine's `tile` (gemm.TF32_TILE)."""
    BM, BN = tile[:2]
    return -(-M // BM) * -(-N // BN) * lanes >= TF32_MIN_BLOCKS


def gemm_engine(backend_name: str, dtype, lanes: int, tensor_cores: bool = True) -> str:
    """The engine (the gemm launchers' ENGINES) of a group of `lanes` lanes storing `dtype` on a backend whose GPU
    runs the tensor-core engines where `tensor_cores` (its gemm.tensor_cores())."""
    return "tf32x3" if backend_name == "cuda" and tensor_cores and np.dtype(dtype) == np.float32 \
        and lanes >= TF32_LANES else "fma"


class LaneStep:
    """The buffers and launches of one step of K lanes of MLP sessions; `template` is one lane's session (its
    buffers are rows of `slabs`)."""

    def __init__(self, backend, slabs, template):
        self.backend, self.lanes = backend, slabs.lanes
        model, step, window = template.model, template.step, template.window
        slab = slabs.slab_of
        self.widths, self.activation = model.widths, model.activation
        self.dtype = np.dtype(model.h[0].dtype)
        self.layers = [(model.layout.offsets[model.layout.names.index(f"fc{i}.{part}")],
                        model.layout.shapes[model.layout.names.index(f"fc{i}.{part}")])
                       for i in range(1, len(self.widths)) for part in ("weight", "bias")]
        self.optimizer = step.optimizer.hparams
        self.images, self.labels = window.split.images, window.split.labels
        self.scale, self.shift, self.batch_size = window.scale, window.shift, window.batch_size
        # every lane's buffers, (K, ...) each; what a step of the first n lanes reads is their first n rows
        self.slabs = {
            "params": slab(model.params.flat), "grads": slab(model.grads.flat),
            "compute": slab(model.compute.flat) if model.compute is not model.params else None,
            **{f"optim/{name}": slab(buf) for name, buf in step.optimizer.state.items()},
            "state": slab(step.state), "partials": slab(step.partials), "lr_table": slab(step.lr_table),
            "grad_norms": slab(step.grad_norms), "order": slab(window.order), "cursor": slab(window.cursor),
            "row_loss": slab(window.row_loss), "row_correct": slab(window.row_correct),
            "step_hypers": backend.zeros((self.lanes, len(step_state.LANE_HYPERS)), np.float64),
            "optimizer_hypers": backend.zeros((self.lanes, len(step.optimizer.lane_hypers())), np.float32),
            "active": backend.zeros((self.lanes,), np.int32)}
        # how the dense GEMMs sum (the gemm launchers' ENGINES): float32 lanes on the GPU, TF32_LANES of them or
        # more, take tf32x3 (float32 on tensor cores at float32 accuracy, its operands staged four elements a
        # load), 15% faster a step than "fma" at 16 and 32 lanes of adam_mnist on an H200 and level at 8
        # (benchmarks/NOTES.md, issue 30 step 13): its one 64 x 64 tile needs many lanes' blocks to fill the GPU,
        # and a pass whose outputs make too few of them still runs on "fma" (`_pass_engine`). Chosen by K, not by
        # the lanes a launch covers, so a lane's sums never depend on who steps with it.
        self.engine = gemm_engine(backend.name, self.dtype, self.lanes, backend.kernels.gemm.tensor_cores())
        # the lanes whose tile the GEMMs take (None: the lanes launched): K where which lanes a launch covers
        # follows the host's timing (a staggered group), so that a lane's sums never depend on it
        self.tiles_for = None
        self._buffers, self._prefixes = {}, {}
        # Adam's update sums the gradient's squares as it reads it (the lanes whose norm nothing reads before the
        # update record it after: step_state.norm_later, decided on the device lane by lane); the sum of squares
        # of its own runs only while a lane here reads its norm first (clipping, loss scaling)
        self.update_sums_norm = step.optimizer.sums_norm
        self._norm_first = set()
        self._squares = None  # (K, columns): the fused layers' squares by block (_epilogue_update)

    @property
    def plan(self) -> bool:
        """What decides which kernels a step launches (a captured graph holds one plan's): whether the sum of
        squares runs before the update."""
        return bool(self._norm_first) or not self.update_sums_norm

    def set_lane(self, lane: int, session) -> None:
        """Lane `lane`'s hyperparameters, from its session (a copy from the host: when a trial joins)."""
        self.backend.copy_from_host(self.slabs["step_hypers"][lane], session.step.lane_hypers())
        self.backend.copy_from_host(self.slabs["optimizer_hypers"][lane], session.step.optimizer.lane_hypers())
        if session.step.norm_later:
            self._norm_first.discard(lane)
        else:
            self._norm_first.add(lane)

    def clear_lane(self, lane: int) -> None:
        """Lane `lane` holds no run any more: its rules no longer decide the plan."""
        self._norm_first.discard(lane)

    def set_active(self, active: np.ndarray) -> None:
        self.backend.copy_from_host(self.slabs["active"], np.asarray(active, np.int32))

    def _lanes(self, n: int) -> SimpleNamespace:
        """The operands of a step of lanes [0, n), made once: the lanes past the last that steps cost nothing
        (a sweep's last trials, fewer than K, train at the cost of as many lanes as they are). Never fewer than
        two: a one-lane view is C-contiguous, another signature for every kernel, which compiled anew in the
        middle of a sweep on the GPU (8.6 s; benchmarks/NOTES.md, issue 30 step 10); the second, masked, costs
        its GEMMs nothing."""
        n = min(self.lanes, max(n, 2))
        if n not in self._prefixes:
            rows = {name: None if array is None else array[:n] for name, array in self.slabs.items()}
            if rows["compute"] is None:  # fp32: the compute copy is the parameters themselves (one array)
                rows["compute"] = rows["params"]
            compute = rows["compute"]
            views = [(lane_view(compute, *self.layers[i]), lane_view(compute, *self.layers[i + 1]),
                      lane_view(rows["grads"], *self.layers[i]), lane_view(rows["grads"], *self.layers[i + 1]))
                     for i in range(0, len(self.layers), 2)]
            self._prefixes[n] = SimpleNamespace(
                **{name.replace("/", "_"): array for name, array in rows.items()},
                weights=[(w, b) for w, b, _, _ in views], weight_grads=[(dw, db) for _, _, dw, db in views],
                loss_scale=lane_view(rows["state"], step_state.LOSS_SCALE, (1,)), lanes=n)
        return self._prefixes[n]

    def _views(self, rows: int, n: int):
        """(activations, their gradients, labels) of a micro-batch of `rows` for lanes [0, n): rows of buffers
        made once for every lane."""
        if rows not in self._buffers:
            empty, lanes = self.backend.empty, self.lanes
            h = [empty((lanes, rows, w), self.dtype) for w in self.widths]
            grad = [None] + [empty((lanes, rows, w), self.dtype) for w in self.widths[1:]]
            self._buffers[rows] = (h, grad, empty((lanes, rows), np.int32))
        h, grad, labels = self._buffers[rows]
        return [a[:n] for a in h], [None] + [g[:n] for g in grad[1:]], labels[:n]

    def launches(self, rows: int, lanes: int | None = None) -> None:
        """Every active lane's optimizer step over the `rows` samples at its cursor (a window of its epoch), in
        one launch per kernel over lanes [0, `lanes`) (default all: the active ones among them step)."""
        k, o = self.backend.kernels, self._lanes(lanes or self.lanes)
        fused = self._epilogue_update(rows)
        for offset in range(0, rows, self.batch_size):
            n = min(self.batch_size, rows - offset)
            h, grad, labels = self._views(n, o.lanes)
            k.data.gather_lanes(self.images, self.labels, o.order, offset, h[0], labels, self.scale, self.shift,
                                o.cursor, o.active)
            self._forward(o, h)
            k.loss.softmax_cross_entropy_lanes(h[-1], labels, grad[-1], o.row_loss, o.row_correct, offset,
                                               1.0 / rows, o.loss_scale, o.cursor, o.active)
            self._backward(o, h, grad, 0.0 if offset == 0 else 1.0, fused)
        # the cursors' advance in the step's last rules launch, not one of its own
        later = self.update_sums_norm
        if self.plan:
            k.reduce.sum_of_squares_lanes(o.grads, o.partials)
        if fused:  # the rules and the fused layers' updates came with their weight gradients (_backward): the rest now
            self._update_rest(o, fused)
        else:
            k.step_rules.finish_step_lanes(o.partials, o.state, o.lr_table, o.grad_norms, o.step_hypers, o.active,
                                           norm_later=later, **({} if later else {"cursor": o.cursor, "advance": rows}))
            self._update(o)
        if later:
            k.step_rules.record_norm_lanes(o.partials, o.state, o.grad_norms, o.step_hypers, o.active,
                                           cursor=o.cursor, advance=rows)

    def _pass_engine(self, M: int, N: int, narrow: int) -> str:
        """The engine of a pass with M x N outputs a lane, of a layer of `narrow` outputs: the group's, except
        that where it is tf32x3 a layer of the gemm's NARROW_MOST outputs or fewer takes "narrow", and a pass its
        tile would cover with too few blocks (`tf32x3_fills`, for all K lanes) "fma"."""
        # a classifier's output layer: its three passes for 16 lanes of adam_mnist took 54 µs of a ~370 µs step
        # on the tile engines (ncu, H100; benchmarks/NOTES.md, issue 30 step 18); where the group's engine is
        # tf32x3, a lane's bits differ from its run alone anyway
        if self.engine == "tf32x3" and narrow <= self.backend.kernels.gemm.NARROW_MOST:
            return "narrow"
        if self.engine == "tf32x3" and not tf32x3_fills(M, N, self.lanes, self.backend.kernels.gemm.TF32_TILE):
            return "fma"
        return self.engine

    def _forward(self, o, h) -> None:
        gemm, last = self.backend.kernels.gemm, len(o.weights) - 1
        for i, (w, b) in enumerate(o.weights):
            rows, width = tuple(h[i + 1].shape)[1:]
            gemm.linear_forward(h[i], w, b, h[i + 1], NONE if i == last else self.activation,
                                self._pass_engine(rows, width, width), tiles_for=self.tiles_for, active=o.active)

    def _backward(self, o, h, grad, beta: float, fused: tuple = ()) -> None:
        """Every layer's gradients; with `fused` (_epilogue_update's layers), the rules first, and those layers'
        gradients with their update in their epilogue, their squares by block."""
        k, backend = self.backend.kernels, self.backend
        epilogue = {i: (first, blocks) for i, first, blocks in fused}
        if fused:  # the rules need no norm here: before the epilogues that read them
            k.step_rules.finish_step_lanes(o.partials, o.state, o.lr_table, o.grad_norms, o.step_hypers, o.active,
                                           norm_later=True)
        for i in reversed(range(len(o.weights))):
            dw, db = o.weight_grads[i]
            fan_in, fan_out = tuple(dw.shape)[1:]
            if i in epilogue:  # the layer's input gradient reads its weights: it comes first
                if i > 0:
                    self._input_gradient(o, i, grad, h)
                with backend.beside() if i else contextlib.nullcontext():
                    self._update_in_epilogue(o, i, h[i], grad[i + 1], *epilogue[i])
                continue
            # a hidden layer's weight and bias gradients may run beside the input gradients below it, which never
            # read them (as a run's own: nn.mlp); the first layer's are the pass's last: in order
            with backend.beside() if i else contextlib.nullcontext():
                k.gemm.linear_backward_weight_bias(h[i], grad[i + 1], dw, db, beta,
                                                   engine=self._pass_engine(fan_in, fan_out, fan_out),
                                                   tiles_for=self.tiles_for, active=o.active)
            if i > 0:
                self._input_gradient(o, i, grad, h)
        backend.join_beside()  # before the next micro-batch's forward rewrites what they read, and the update

    def _input_gradient(self, o, i: int, grad, h) -> None:
        fan_in, fan_out = self.layers[2 * i][1]
        rows = tuple(grad[i].shape)[1]
        self.backend.kernels.gemm.linear_backward_input(grad[i + 1], o.weights[i][0], h[i], grad[i], self.activation,
                                                        self._pass_engine(rows, fan_in, fan_out),
                                                        tiles_for=self.tiles_for, active=o.active)

    def _epilogue_update(self, rows: int) -> tuple:
        """The layers whose update comes in their weight-and-bias blocks' epilogue, as (layer, its first column of
        the squares, its columns: blocks a lane) triples (none: ()): Adam with no lane reading its norm first (the
        rules need no norm, so they come before the backward), a window of one micro-batch, and the hidden layers
        from the first whose weight gradient runs on an engine of EPILOGUE_UPDATE in one weight-and-bias launch. In
        the epilogue a gradient is neither written nor read back (benchmarks/NOTES.md, issue 30 steps 31 and 32).
        Each element's update is the same; the squares are summed in another order."""
        if self.engine not in EPILOGUE_UPDATE or self.plan or rows > self.batch_size \
                or isinstance(self.optimizer, (SGD, Momentum)):
            return ()
        from mlptrain.backends.numba_kernels.gemm_update import update_blocks  # the GPU's path only

        fused, columns = [], 0
        for i in range(len(self.layers) // 2 - 1):  # never the output layer
            fan_in, fan_out = self.layers[2 * i][1]
            engine = self._pass_engine(fan_in, fan_out, fan_out)
            blocks = update_blocks(engine, self.batch_size, fan_in, fan_out, self.lanes, self.tiles_for) \
                if engine in EPILOGUE_UPDATE else None
            if blocks is None:
                break
            fused.append((i, columns, blocks))
            columns += blocks
        if fused and (self._squares is None or tuple(self._squares.shape)[1] != columns):  # before any capture
            self._squares = self.backend.empty((self.lanes, columns), np.float32)
        return tuple(fused)

    def _update_in_epilogue(self, o, i: int, x, dy, first: int, blocks: int) -> None:
        from mlptrain.backends.numba_kernels.gemm_update import linear_backward_weight_bias_update  # the GPU's path

        (w_at, w_shape), (b_at, b_shape) = self.layers[2 * i:2 * i + 2]
        fan_in, fan_out = w_shape
        engine = self._pass_engine(fan_in, fan_out, fan_out)
        weight = [lane_view(a, w_at, (fan_in * fan_out,)) for a in (o.params, o.optim_m, o.optim_v)]
        bias = [lane_view(a, b_at, b_shape) for a in (o.params, o.optim_m, o.optim_v)]
        linear_backward_weight_bias_update(x, dy, weight, bias, o.state, o.optimizer_hypers,
                                           lane_view(self._squares[:o.lanes], first, (blocks,)), o.active, engine,
                                           self.tiles_for)

    def _update_rest(self, o, fused: tuple) -> None:
        """Adam's update of the parameters past the fused layers', summing their squares into the partials, then
        the fused layers' squares added to them."""
        from mlptrain.backends.numba_kernels.gemm_update import add_squares  # the GPU's path only

        cut, size = self.layers[2 * len(fused)][0], tuple(o.params.shape)[1]

        def rest(array):
            return lane_view(array, cut, (size - cut,))

        params = rest(o.params)
        compute = params if o.compute is o.params else rest(o.compute)  # fp32: the parameters, not written twice
        self.backend.kernels.optim.adam_update_lanes(
            params, rest(o.grads), rest(o.optim_m), rest(o.optim_v), compute, o.state, o.optimizer_hypers, o.active,
            partials=o.partials)
        squares = self._squares[:o.lanes]
        add_squares(squares, tuple(squares.shape)[1], o.partials, o.active)

    def _update(self, o) -> None:
        optim = self.backend.kernels.optim
        args = (o.compute, o.state, o.optimizer_hypers, o.active)
        if isinstance(self.optimizer, SGD):
            optim.sgd_update_lanes(o.params, o.grads, *args)
        elif isinstance(self.optimizer, Momentum):
            optim.momentum_update_lanes(o.params, o.grads, o.optim_velocity, *args)
        else:  # every active lane's squares summed too (a lane whose norm came first finds its partials rewritten
            # with the same bits)
            optim.adam_update_lanes(o.params, o.grads, o.optim_m, o.optim_v, *args, partials=o.partials)
