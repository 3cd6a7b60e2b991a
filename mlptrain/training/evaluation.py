"""Evaluation: a model's mean loss and accuracy over a whole split (the autoencoder's reconstruction
MSE), each epoch's evaluation record, and the autoencoder's reconstruction grid and mean-image baseline."""

from __future__ import annotations

import numpy as np

from mlptrain.dtypes import to_float32
from mlptrain.util.console import console


class Evaluator:
    """Per-sample result buffers for the largest split evaluated, allocated once, and the passes over a
    split in `eval_batch_size` batches."""

    def __init__(self, backend, model, eval_batch_size: int, rows: int, scale: float, shift: float):
        self.backend, self.model, self.batch_size = backend, model, eval_batch_size
        self.scale, self.shift = scale, shift
        self.classifies = model.task == "classification"
        self.row_loss = backend.empty((max(rows, 1),))
        self.row_correct = backend.empty((max(rows, 1),), np.int32)
        self.unit_scale = backend.to_device(np.ones(1, np.float64))  # a loss scale of 1: the gradient is discarded

    def evaluate(self, split) -> tuple[float, float]:
        """(mean loss, accuracy) over a whole split, in eval-sized batches; for the autoencoder the loss
        is the reconstruction MSE and the accuracy NaN."""
        for start in range(0, split.size, self.batch_size):
            self.launch_batch(split, start, min(self.batch_size, split.size - start))
        if split.size == 0:
            return float("nan"), float("nan")
        return self.mean_loss_and_accuracy(self.row_loss, self.row_correct, 0, split.size)

    def launch_batch(self, split, start: int, rows: int) -> None:
        """Gather, forward and per-sample loss of split rows [start, start + rows)."""
        x, labels = self.model.batch(rows)
        self.backend.kernels.data.gather_batch(split.images, split.labels, split.device_index, start, x, labels,
                                               self.scale, self.shift)
        self.model.forward(rows)
        self.model.loss(rows, self.row_loss, self.row_correct, start, 0.0, self.unit_scale)

    def mean_loss_and_accuracy(self, row_loss, row_correct, lo: int, hi: int) -> tuple[float, float]:
        """Reads per-sample results [lo, hi) to the host (a synchronisation) and averages them in float64
        (the accuracy is NaN for a model without one)."""
        loss = self.backend.to_host(row_loss[lo:hi]).astype(np.float64).mean()
        acc = self.backend.to_host(row_correct[lo:hi]).mean() if self.classifies else np.nan
        return float(loss), float(acc)

    def record(self, val, test, epoch: int, step: int) -> dict:
        """Evaluate on val and test: epoch, step and val_loss/val_acc/test_loss/test_acc (val_mse/test_mse
        for the autoencoder)."""
        val_loss, val_acc = self.evaluate(val)
        test_loss, test_acc = self.evaluate(test)
        if self.classifies:
            return {"epoch": epoch, "step": step, "val_loss": val_loss, "val_acc": val_acc,
                    "test_loss": test_loss, "test_acc": test_acc}
        return {"epoch": epoch, "step": step, "val_mse": val_loss, "test_mse": test_loss}

    def train_means(self, row_loss, row_correct, rows: int, known: bool = True) -> dict:
        """The epoch's training loss (and accuracy) as metrics.jsonl records them: the mean over the epoch's
        `rows` samples of each one's loss when it was trained (the parameters of its step, as Keras and
        Lightning report it). None where part of the epoch ran in an earlier process that kept no record of
        it (`known` false)."""
        loss, acc = self.mean_loss_and_accuracy(row_loss, row_correct, 0, rows) if known and rows else (None, None)
        return {"train_loss": loss, "train_acc": acc} if self.classifies else {"train_mse": loss}

    def epoch_record(self, val, test, epoch: int, step: int, logger, train: dict | None = None) -> dict:
        """Evaluate on val and test; log the metrics (TensorBoard, metrics.jsonl, one console line, and
        the autoencoder's reconstructions) and return the record, with `train` (train_means) first."""
        r = self.record(val, test, epoch, step)
        r = {"epoch": r["epoch"], "step": r["step"], **(train or {}), **r}
        # train/loss and train/acc are logged at every read already (mlptrain.training.monitor)
        logger.scalars(step, {key.replace("_", "/"): value for key, value in r.items()
                              if key not in ("epoch", "step") and not key.startswith("train_")})
        said = ""
        if train and all(value is not None for value in train.values()):
            said = (f"train loss {train['train_loss']:.4f} acc {train['train_acc']:.4f} | " if self.classifies
                    else f"train mse {train['train_mse']:.5f} | ")
        if self.classifies:
            console.print(f"epoch {epoch}: {said}val loss {r['val_loss']:.4f} acc {r['val_acc']:.4f} | test loss "
                          f"{r['test_loss']:.4f} acc {r['test_acc']:.4f}")
        else:
            logger.image("test/reconstructions", self.reconstruction_grid(test), step)
            console.print(f"epoch {epoch}: {said}val mse {r['val_mse']:.5f} | test mse {r['test_mse']:.5f}")
        logger.evaluation(r)
        return r

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


def mean_image_mse(dataset) -> float:
    """The baseline a reconstruction must beat: the test MSE (pixels / 255) of predicting the mean training
    image for every test image."""
    mean = dataset.train_images.mean(axis=0, dtype=np.float64) / 255.0
    return float(np.mean((dataset.test_images / 255.0 - mean) ** 2))
