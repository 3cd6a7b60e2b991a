"""One optimizer step over a window of samples, and the CUDA graph that replays it.

A window is `train.batch_size * train.grad_accum_steps` samples taken in the epoch's order: for each
micro-batch, gather + normalise it on the device, forward, the loss (its gradient scaled by 1 / samples
in the window), and backward adding into the flat float32 gradient buffer; then ONE optimizer step
(`OptimizerStep`: norm, device-side loss scaling / skip / clipping / lr, fused update). Per-sample losses
and outcomes (1 for a hit, for a miss -1 - the predicted class) land in `row_loss` / `row_correct`,
indexed by position in the epoch, for the host to read where it synchronises anyway.

The window's position is read on the device from `cursor`, which the step advances on the device, so
consecutive windows need no host copy (a copy from pageable memory would wait for the GPU). On a GPU
the first full window runs launch by launch (compiling the kernels), then its launches are captured as
one CUDA graph that every later full window replays: the same kernels with the same arguments, so the
results are bitwise those of launching them one by one. The epoch's last window, where it is partial, gets a
graph of its own the same way. Where no graph can be captured, the launches
go one by one; on a CUDA backend that is a fallback (one warning line, recorded in summary.json).
"""

from __future__ import annotations

import time

import numpy as np

from mlptrain.training.fallbacks import warn


class TrainingWindow:
    """The epoch's order, per-sample results and device cursor of the training split, allocated once
    (their addresses never change, so a captured graph stays valid), and the launches of one step."""

    # whether the loop may hand in every window up to its next read before it yields (training.loop.window_spans):
    # a run's own window launches at `run`, and its loop yields after each; a packed lane's
    # (mlptrain.packing.lane_group.LaneWindow) only queues it for its group. Either way a stop comes after the step
    # it was asked in (`withdraw`)
    spans = False

    def __init__(self, backend, model, step, split, scale: float, shift: float, train_config):
        self.backend, self.model, self.step, self.split = backend, model, step, split
        self.scale, self.shift = scale, shift  # pixel -> pixel * scale + shift, in the gather kernel
        self.batch_size, self.full_rows = train_config.batch_size, train_config.effective_batch_size
        self.order = backend.empty((split.size,), np.int32)  # refilled in place each epoch
        self.row_loss = backend.empty((split.size,))
        self.row_correct = backend.empty((split.size,), np.int32)
        self.cursor = backend.zeros((1,), np.int64)  # the window's start in the order: a replay reads it
        self.cursor_at: int | None = None  # where the device cursor stands after the launches queued so far
        self.graph = None
        # the epoch's last window where it is partial: (its rows, its graph or None where none was captured),
        # captured right after its first launch (which compiles), where the full window's graph was
        self.partial = None
        self.graph_tried = not train_config.cuda_graphs  # nothing to try when they are off
        self.graphs_off = None if train_config.cuda_graphs else "train.cuda_graphs is false"
        self.fallback: str | None = None  # the warning line when a CUDA backend runs without a graph
        self.first_step_at: float | None = None  # time.time() when the first step was queued (summary.json)
        self.rows_known = True  # whether row_loss holds every trained row of this epoch (see restore_rows)
        self.epoch_read = None  # the epoch's last read queued (training.loop): its mark and host copies
        self.unreported = None  # a queued epoch end's reads not reported yet, and their seconds' start (training.loop)
        self.order_ahead = None  # (epoch, order): the next epoch's order, made while the GPU trains (training.loop)

    def kernels_made_ready(self, make) -> list[str]:
        """The fallback notes of making this window's (and the run's evaluation) kernels ready: `make()`
        (training.compilation), here for this run alone."""
        return make()

    def read_copies(self, lo: int, hi: int, outcomes: bool):
        """Host copies, queued now (Backend.to_host_later), of the per-sample losses of rows [lo, hi), their
        outcomes where `outcomes`, and the step state: a period's read (mlptrain.training.reads)."""
        rows = [self.row_loss[lo:hi], *([self.row_correct[lo:hi]] if outcomes else [])]
        return self.backend.to_host_later([*rows, self.step.state])

    def read_metrics(self, copies, row_metrics) -> tuple[float, float]:
        """(loss, acc) of a read's copies (`read_copies`'): `row_metrics` (Evaluator.row_metrics) of its rows."""
        *rows, _ = copies.take()
        loss, acc, _ = row_metrics(*rows)
        return loss, acc

    def start_epoch(self, order: np.ndarray) -> None:
        """Load the epoch's order: a copy queued after the last epoch's steps, which read the order before it
        (nothing waits for the device here: a packed group's lanes share a stream, and a synchronisation at each
        lane's epoch start drained every other lane's queued steps; the copy is queued from pinned memory,
        Backend.copy_from_host_later, as one from pageable memory waited for the stream to reach it)."""
        self.backend.copy_from_host_later(self.order, order)

    def withdraw(self) -> int:
        """How many of the windows handed in were taken back, not launched, at a stop (the loop counts them
        undone). A run's own window launches at `run`: none."""
        return 0

    def run(self, start: int, rows: int) -> None:
        """One optimizer step over the `rows` samples at `start` in the epoch's order: its micro-batches add
        up the gradient of the window's mean loss (so the update equals one batch of `rows`), then one
        update. A full window replays the graph once there is one."""
        if self.cursor_at != start:
            self.backend.copy_from_host(self.cursor, np.array([start], np.int64))
        full = rows == self.full_rows
        graph = self.graph if full else self.partial[1] if self.partial and self.partial[0] == rows else None
        if graph is not None:
            graph.replay()
        else:
            self._launches(rows)
            if full and not self.graph_tried:
                self.graph_tried = True
                self._capture(rows)
            elif not full and self.graph is not None and self.partial is None:
                self._capture_partial(rows)
        self.cursor_at = start + rows
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def rows_done(self, windows: int) -> dict[str, np.ndarray]:
        """The per-sample results of the epoch's first `windows` optimizer steps, for a checkpoint inside the
        epoch (epoch/row_loss, epoch/row_correct): a resumed run then reports the whole epoch's means."""
        rows = min(windows * self.full_rows, self.split.size)
        return {"epoch/row_loss": np.array(self.backend.to_host(self.row_loss[:rows])),  # copies: training goes on
                "epoch/row_correct": np.array(self.backend.to_host(self.row_correct[:rows]))}

    def restore_rows(self, arrays: dict) -> None:
        """Put back a checkpoint's rows_done; a checkpoint without them (written before they were kept)
        leaves this epoch's training means unknown."""
        loss, correct = arrays.get("epoch/row_loss"), arrays.get("epoch/row_correct")
        if loss is None or correct is None or len(loss) != len(correct) or len(loss) > self.split.size:
            self.rows_known = False
            return
        self.backend.copy_from_host(self.row_loss[:len(loss)], np.ascontiguousarray(loss, self.row_loss.dtype))
        self.backend.copy_from_host(self.row_correct[:len(correct)],
                                    np.ascontiguousarray(correct, self.row_correct.dtype))

    def plan(self, rows: int) -> None:
        """The launches of a window of `rows` samples, for kernel_cache.planning to record (they do not run
        there, and nothing here changes)."""
        self._launches(rows)

    def _launches(self, rows: int) -> None:
        """The launches of one window of `rows` samples at the device cursor, which the last one advances."""
        k = self.backend.kernels
        s, model = self.split, self.model
        for offset in range(0, rows, self.batch_size):
            n = min(self.batch_size, rows - offset)
            x, labels = model.batch(n)
            k.data.gather_batch(s.images, s.labels, self.order, offset, x, labels, self.scale, self.shift, self.cursor)
            model.train_pass(n, self.row_loss, self.row_correct, offset, 1.0 / rows, self.step.loss_scale,
                             self.cursor, 0.0 if offset == 0 else 1.0)
        self.step(model.params.flat, model.grads.flat, model.compute.flat, self.cursor, rows)

    def _capture(self, rows: int) -> None:
        """Record a full window's launches as a graph; where none is recorded, say why."""
        try:
            self.graph = self.backend.capture(lambda: self._launches(rows))
        except RuntimeError as err:  # the driver refused the capture: launch one by one, as without graphs
            self.graphs_off = f"the driver refused the capture ({err})"
            self.fallback = warn(f"no CUDA graph ({err}); launching kernels one by one")
            return
        if self.graph is None:
            self.graphs_off = self.backend.graphs_unavailable()
            if self.backend.name == "cuda":
                self.fallback = warn(f"no CUDA graph ({self.graphs_off}); launching kernels one by one")

    def _capture_partial(self, rows: int) -> None:
        """Record the epoch's last, partial window as a graph of its own: launched one by one it cost the host
        ~2 ms an epoch on an H200, the GPU's time for 20 windows at batch 2048 (benchmarks/NOTES.md, issue 31
        step 7). A refused capture leaves it launched one by one, as before, with one warning line (in
        summary.json's fallbacks)."""
        try:
            self.partial = (rows, self.backend.capture(lambda: self._launches(rows)))
        except RuntimeError as err:  # the full window's was captured, so nothing was said before
            self.partial = (rows, None)
            self.fallback = warn(f"no CUDA graph for the partial last window ({err}); launching its kernels one "
                                 "by one")

    def graphs_record(self) -> dict:
        """summary.json's `cuda_graphs` (whether full windows replayed a graph) and `cuda_graphs_off` (why
        not; None when they did)."""
        off = self.graphs_off
        if self.graph is None and off is None:
            off = "no full window (train.batch_size x train.grad_accum_steps samples) ran"
        return {"cuda_graphs": self.graph is not None, "cuda_graphs_off": off}
