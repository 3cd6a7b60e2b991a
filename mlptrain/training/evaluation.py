"""Evaluation: a model's mean loss and accuracy over a whole split (the autoencoder's reconstruction
MSE), each epoch's evaluation record with a classifier's confusion matrices, and the autoencoder's
reconstruction grid and mean-image baseline."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from mlptrain.backends.thread_stream import launch_stream
from mlptrain.dtypes import to_float32
from mlptrain.run_dirs.records import metric_tag
from mlptrain.training.confusion import OutcomeCounts, confusion_image
from mlptrain.training.steps import finish
from mlptrain.util.console import console, warn


@dataclass
class _SplitGraph:
    """A split's passes on one launch stream and the graph of them (None until the second, and where none was
    captured); the split and stream are held so that the ids keying it stay theirs."""

    split: object
    stream: object
    graph: object = None
    passes: int = 0
    ahead: bool = False  # a capture ahead was tried (Evaluator.capture_ahead): not again


class Evaluator:
    """Per-sample result buffers for the largest split evaluated, allocated once, and the passes over a
    split in `eval_batch_size` batches.

    A split's pass runs launch by launch the first time; the second is captured as one CUDA graph that it and
    every later pass replay (`graphs`, train.cuda_graphs; a split evaluated once, like the test split at a
    run's end, is never captured; one of `every_epoch` at its first, once `kernels_ready`): ~6 launches a batch cost ~0.36
    ms of host time each, which the lanes of a packed sweep (mlptrain.packing.lane_group) paid in turn at every
    epoch's end while the GPU idled. A replay runs the same kernels with the same arguments (every buffer stays where it is), so the
    results are bitwise those of the launches."""

    def __init__(self, backend, model, eval_batch_size: int, rows: int, scale: float, shift: float,
                 graphs: bool = True, every_epoch: tuple = ()):
        self.backend, self.model, self.batch_size = backend, model, eval_batch_size
        self.scale, self.shift = scale, shift
        # splits evaluated at every epoch's end (val; test with train.eval_test every_epoch): their first pass is
        # captured, not launched one by one and then captured at the second (16 packed lanes' captures at their
        # second epoch's end left the GPU idle ~70 ms longer than at the others: benchmarks/NOTES.md, issue 30)
        self.every_epoch = every_epoch
        # compile_kernels has loaded every kernel of this evaluator's passes: a first pass's capture then compiles
        # and loads nothing (a capture that must is refused by the driver)
        self.kernels_ready = False
        # (id(split), id(launch stream)) -> its _SplitGraph; None: no graphs
        self.graphs: dict[tuple[int, int], _SplitGraph] | None = {} if graphs else None
        self.fallback: str | None = None  # the warning line when the driver refused a capture
        self.classifies = model.task == "classification"
        self.row_loss = backend.empty((max(rows, 1),))
        self.row_correct = backend.empty((max(rows, 1),), np.int32)
        self.unit_scale = backend.to_device(np.ones(1, np.float64))  # a loss scale of 1: the gradient is discarded
        self.counts, self.confusion = {}, {}  # a split's OutcomeCounts (its labels); the matrices not yet drawn

    def evaluate(self, split) -> tuple[float, float]:
        """(mean loss, accuracy) over a whole split, in eval-sized batches; for the autoencoder the loss
        is the reconstruction MSE and the accuracy NaN."""
        loss, acc, _ = self.evaluate_rows(split)
        return loss, acc

    def evaluate_rows(self, split) -> tuple[float, float, np.ndarray | None]:
        """`evaluate`, with each row's outcome as the loss kernel wrote it (a classifier's: 1 for a hit, else
        -1 - the predicted class; None for the autoencoder)."""
        return finish(self.evaluate_rows_steps(split))

    def evaluate_rows_steps(self, split):
        """`evaluate_rows` as a generator: it queues the split's batches, yields a backend mark recorded after
        them (None on the CPU), then reads the rows once the mark is done and returns what evaluate_rows
        does. Packed runs (mlptrain.packing.side_by_side) queue their steps while this run's evaluation runs,
        instead of the host waiting for it."""
        self.launch_split(split)
        if split.size == 0:
            return float("nan"), float("nan"), None
        mark = self.backend.mark()
        yield mark
        return self.read_rows(self.row_loss, self.row_correct, 0, split.size, mark)

    def launch_split(self, split) -> None:
        """Every batch of `split`: its graph replayed where there is one, else launched; the second pass on this
        launch stream captures the graph first. The graph is the stream's: a replay goes where the capture's
        launches would have gone (a packed run's evaluation runs on an urgent stream, its test at the end on its
        own)."""
        if self.graphs is None or split.size == 0:
            self._launch_batches(split)
            return
        stream = launch_stream()
        entry = self.graphs.setdefault((id(split), id(stream)), _SplitGraph(split, stream))
        entry.passes += 1
        # a split evaluated once (the test split at a run's end) launched one by one: a graph would cost its
        # capture; another's first pass launched so too where it may not come again, and captured at its second
        first = self.kernels_ready and any(split is every for every in self.every_epoch)
        if entry.passes == (1 if first else 2) and entry.graph is None:  # none captured ahead
            entry.graph = self._capture(split)
        if entry.graph is not None:
            entry.graph.replay()
        else:
            self._launch_batches(split)

    def capture_ahead(self, split) -> None:
        """`split`'s graph captured now, before its first pass, which replays it: the test split of a run that
        evaluates it once, at its end, captured while the run still trains. At a 16-lane sweep's end each lane's
        test split was launched batch by batch, ~3 ms of host time a lane in turn (benchmarks/NOTES.md, issue
        30 step 25), and a capture records launches without running them. Only where the split's first pass would
        be launched on this launch stream with every kernel loaded (`kernels_ready`); else nothing."""
        if self.graphs is None or split is None or split.size == 0 or not self.kernels_ready:
            return
        stream = launch_stream()
        entry = self.graphs.setdefault((id(split), id(stream)), _SplitGraph(split, stream))
        if entry.passes == 0 and not entry.ahead:  # once: a driver that refused it would refuse it again
            entry.ahead = True
            entry.graph = self._capture(split)

    def _capture(self, split):
        try:
            return self.backend.capture(lambda: self._launch_batches(split))
        except RuntimeError as err:  # the driver refused the capture: passes launch one by one
            if self.fallback is None:
                self.fallback = warn(f"no CUDA graph for the evaluation ({err}); launching its kernels one by one")
            return None

    def _launch_batches(self, split) -> None:
        for start in range(0, split.size, self.batch_size):
            self.launch_batch(split, start, min(self.batch_size, split.size - start))

    def launch_batch(self, split, start: int, rows: int) -> None:
        """Gather, forward and per-sample loss of split rows [start, start + rows)."""
        x, labels = self.model.batch(rows)
        self.backend.kernels.data.gather_batch(split.images, split.labels, split.device_index, start, x, labels,
                                               self.scale, self.shift)
        self.model.forward_loss(rows, self.row_loss, self.row_correct, start, 0.0, self.unit_scale)

    def read_rows(self, row_loss, row_correct, lo: int, hi: int, after=None) -> tuple[float, float, np.ndarray | None]:
        """Per-sample results [lo, hi) read to the host and averaged in float64: (mean loss, accuracy (NaN for a
        model without one), the rows' outcomes (None for the autoencoder)). `after`: a backend mark recorded
        after the steps that wrote the rows: read once it is done, not waiting for the steps queued since (which
        write other rows); None: after everything queued (a synchronisation)."""
        losses = self.backend.to_host_after(row_loss[lo:hi], after)
        return self.row_metrics(losses, self.backend.to_host_after(row_correct[lo:hi], after) if self.classifies
                                else None)

    def row_metrics(self, losses: np.ndarray, outcomes: np.ndarray | None = None) -> tuple:
        """`read_rows` of per-sample results on the host already (`outcomes` unread for the autoencoder). Rows with
        a lane axis first (a packed group's, [K, n]) give a loss and an accuracy a lane, arrays: each lane's the bits
        of its row alone (NumPy sums each row of the last, contiguous axis pairwise, as it sums a row alone)."""
        loss = losses.astype(np.float64).mean(axis=-1)
        loss = float(loss) if loss.ndim == 0 else loss
        if not self.classifies:
            return loss, float("nan"), None
        acc = (outcomes == 1).mean(axis=-1)
        return loss, float(acc) if acc.ndim == 0 else acc, outcomes

    def record(self, val, test, epoch: int, step: int) -> dict:
        """Evaluate on val and, unless `test` is None, on test: epoch, step and val_loss/val_acc/test_loss/
        test_acc (val_mse/test_mse for the autoencoder)."""
        return finish(self.record_steps(val, test, epoch, lambda: step))

    def record_steps(self, val, test, epoch: int, step_of):
        """`record` as a generator (each split's evaluation yields its mark: evaluate_rows_steps); the step is
        `step_of()`, asked once both are read."""
        found = yield from self.metrics_steps("val", val)
        if test is not None:
            found = {**found, **(yield from self.metrics_steps("test", test))}
        return {"epoch": epoch, "step": step_of(), **found}

    def metrics(self, name: str, split) -> dict:
        """`name`_loss and `name`_acc of a split (the autoencoder's `name`_mse); a classifier's confusion
        matrix is kept for `log` to draw."""
        return finish(self.metrics_steps(name, split))

    def metrics_steps(self, name: str, split):
        """`metrics` as a generator (evaluate_rows_steps)."""
        loss, acc, outcomes = yield from self.evaluate_rows_steps(split)
        return self.split_metrics(name, split, loss, acc, outcomes)

    def split_metrics(self, name: str, split, loss: float, acc: float, outcomes: np.ndarray | None) -> dict:
        """`metrics` of a split whose rows are read (evaluate_rows)."""
        if outcomes is None:
            return {f"{name}_loss": loss, f"{name}_acc": acc} if self.classifies else {f"{name}_mse": loss}
        if id(split) not in self.counts:  # the split's labels in its row order, read once
            labels = split.host_labels if split.host_labels is not None else self.backend.to_host(split.labels)
            self.counts[id(split)] = OutcomeCounts(np.asarray(labels)[split.index], self.model.widths[-1])
        self.confusion[name] = self.counts[id(split)].matrix(outcomes)
        return {f"{name}_loss": loss, f"{name}_acc": acc}

    def train_means(self, row_loss, row_correct, rows: int, known: bool = True, after=None) -> dict:
        """The epoch's training loss (and accuracy) as metrics.jsonl records them: the mean over the epoch's
        `rows` samples of each one's loss when it was trained (the parameters of its step, as Keras and
        Lightning report it). None where part of the epoch ran in an earlier process that kept no record of
        it (`known` false). `after`: a backend mark recorded after the epoch's steps (read_rows)."""
        loss, acc = (self.read_rows(row_loss, row_correct, 0, rows, after)[:2] if known and rows else (None, None))
        return self.train_record(loss, acc)

    def train_record(self, loss: float | None, acc: float | None) -> dict:
        """train_means' keys for this model."""
        return {"train_loss": loss, "train_acc": acc} if self.classifies else {"train_mse": loss}

    def epoch_record(self, val, test, epoch: int, step: int, logger, train: dict | None = None) -> dict:
        """Evaluate on val and (unless `test` is None: train.eval_test end, before the run's end) on test;
        log the metrics (TensorBoard, metrics.jsonl, one console line, and the autoencoder's test
        reconstructions) and return the record, with `train` (train_means) first."""
        return finish(self.epoch_record_steps(val, test, epoch, lambda: step, logger, train))

    def epoch_record_steps(self, val, test, epoch: int, step_of, logger, train: dict | None = None,
                           logged: bool = True):
        """`epoch_record` as a generator (record_steps: the step is `step_of()`, asked after the evaluations);
        not `logged`: the caller logs the record later (log_epoch)."""
        r = with_train((yield from self.record_steps(val, test, epoch, step_of)), train)
        if logged:
            self.log_epoch(r, logger, test)
        return r

    def queue_record(self, val, test) -> list[tuple[str, object, object]]:
        """`record`'s evaluations queued, nothing waited for: (name, split, host copies of its rows on their way
        (Backend.to_host_later; None for an empty split)) for val and, unless `test` is None, test; `record_from`
        reads them. A packed lane's epoch end this way keeps the GPU busy while the host is elsewhere
        (mlptrain.training.queued_end)."""
        queued = []
        for name, split in (("val", val), ("test", test)):
            if split is None:
                continue
            self.launch_split(split)
            queued.append((name, split, self.backend.to_host_later(self.split_rows(split)) if split.size else None))
        return queued

    def split_rows(self, split) -> list:
        """The per-sample result buffers of `split`'s rows that queue_record copies to the host."""
        return [self.row_loss[:split.size], *([self.row_correct[:split.size]] if self.classifies else [])]

    def record_from(self, queued: list, epoch: int, step: int, train: dict | None = None) -> dict:
        """`epoch_record_steps`' record (unlogged) of evaluations queue_record queued."""
        found = {}
        for name, split, copies in queued:
            if copies is None:
                loss, acc, outcomes = float("nan"), float("nan"), None
            else:
                loss, acc, outcomes = self.row_metrics(*copies.take())  # split_rows: outcomes where classifying
            found.update(self.split_metrics(name, split, loss, acc, outcomes))
        return with_train({"epoch": epoch, "step": step, **found}, train)

    def log_epoch(self, record: dict, logger, test=None) -> None:
        """An epoch's record (epoch_record_steps) to TensorBoard, metrics.jsonl and one console line."""
        train = {key: record[key] for key in ("train_loss", "train_acc", "train_mse") if key in record}
        said = ""
        if train and all(value is not None for value in train.values()):
            said = (f"train loss {train['train_loss']:.4f} acc {train['train_acc']:.4f} | " if self.classifies
                    else f"train mse {train['train_mse']:.5f} | ")
        # the training loss and accuracy are logged at every read already (mlptrain.training.monitor)
        self.log(record, logger, f"epoch {record['epoch']}: {said}", test)
        logger.evaluation(record)

    def log(self, record: dict, logger, head: str, test=None) -> None:
        """A record's val and test metrics to TensorBoard at its step and as one console line after `head`;
        the autoencoder's reconstructions of `test` when given."""
        logger.scalars(record["step"], {metric_tag(key): value for key, value in record.items()
                                        if key.startswith(("val_", "test_"))})
        parts = []
        for name in ("val", "test"):
            if self.classifies and f"{name}_loss" in record:
                parts.append(f"{name} loss {record[f'{name}_loss']:.4f} acc {record[f'{name}_acc']:.4f}")
            elif f"{name}_mse" in record:
                parts.append(f"{name} mse {record[f'{name}_mse']:.5f}")
        if test is not None and not self.classifies:
            logger.image("reconstructions/test", self.reconstruction_grid(test), record["step"])
        for name in ("val", "test"):
            if f"{name}_acc" in record and name in self.confusion:  # drawn beside the training that follows
                matrix = self.confusion.pop(name)
                logger.image_later(f"confusion/{name}", functools.partial(confusion_image, matrix), record["step"])
        # plain text, coloured on a terminal only, not wrapped (a terminal wraps it): rich's markup, highlighting and
        # wrapping cost ~1 ms a line on the GPU machine, which the lanes of a packed sweep paid in turn at every
        # epoch's end
        console.out(logger.line(head + " | ".join(parts)), highlight=console.is_terminal)

    def test_at_end(self, test, record: dict, logger) -> dict:
        """`record` with the test metrics of the parameters the run ends with, evaluated now when it has none
        (train.eval_test end and a run that stopped early), logged at its step."""
        if any(key.startswith("test_") for key in record):
            return record
        tested = self.metrics("test", test)
        self.log({"step": record["step"], **tested}, logger, f"test, the parameters of epoch {record['epoch']}: ", test)
        return {**record, **tested}

    def reconstruction_grid(self, split, count: int = 8) -> np.ndarray:
        """The first `count` images of `split` (top row) above their reconstructions, (2H, count*W, C) in
        [0, 1]; images of other than 1 or 3 channels as one grey band per channel, (C*2H, count*W, 1)."""
        rows = min(count, split.size)
        x, labels = self.model.batch(rows)
        self.backend.kernels.data.gather_batch(split.images, split.labels, split.device_index, 0, x, labels,
                                               self.scale, self.shift)
        self.model.forward(rows)
        h, w, c = self.model.height, self.model.width, self.model.image_channels
        images = to_float32(self.backend.to_host(x)).reshape(rows, h, w, c)
        recon = to_float32(self.backend.to_host(self.model.reconstruction(rows))).reshape(rows, h, w, c)
        grid = np.concatenate([np.concatenate(list(images), axis=1), np.concatenate(list(recon), axis=1)], axis=0)
        if c not in (1, 3):  # no image format holds 2 or 5+ channels (and 4 would read as alpha): each in
            grid = np.concatenate(list(grid.transpose(2, 0, 1)), axis=0)[..., None]  # turn, a grey band
        return np.clip(grid, 0.0, 1.0)


def with_train(record: dict, train: dict | None) -> dict:
    """An evaluation record with the epoch's training means (train_means) after its epoch and step, as
    metrics.jsonl holds it."""
    return {"epoch": record["epoch"], "step": record["step"], **(train or {}), **record}


def mean_image_mse(dataset) -> float:
    """The baseline a reconstruction must beat: the test MSE (pixels / 255) of predicting the mean training
    image for every test image."""
    mean = dataset.train_images.mean(axis=0, dtype=np.float64) / 255.0
    return float(np.mean((dataset.test_images / 255.0 - mean) ** 2))
