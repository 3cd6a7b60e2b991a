"""`mlptrain evaluate`: a trained run's checkpoint on one split, with what a single number hides.

A classifier reports its mean cross-entropy and accuracy (the training loop's own kernels compute them,
so the numbers match the run's metrics.jsonl), the accuracy of each class and the confusion matrix; the
autoencoder its reconstruction MSE, each class's MSE and, for scale, the MSE of predicting the mean
training image for every image of the split.
"""

from __future__ import annotations

import numpy as np

from mlptrain.inference.model import TrainedModel


def evaluation_report(trained: TrainedModel, split_name: str, progress=None) -> dict:
    """What eval-<split>.json holds; `progress` is a rich Progress to show the pass in, or None."""
    split = trained.split(split_name)
    on_batch = None
    if progress is not None:
        task = progress.add_task(split_name, total=split.size)
        on_batch = lambda rows: progress.advance(task, rows)  # noqa: E731 - a one-line callback
    outputs, row_loss = trained.run(split, on_batch)
    labels = trained.backend.to_host(split.labels)[split.index].astype(np.int64)
    names = trained.class_names
    report = {
        "run": trained.run_dir.resolve().name, "checkpoint": trained.checkpoint, "split": split_name,
        "dataset": trained.dataset.name, "images": int(split.size), "backend": trained.backend.name,
        "precision": trained.config.train.precision, "model": trained.config.model.type,
    }
    if trained.classifies:
        report.update(classification(outputs, row_loss, labels, names))
    else:
        report.update(reconstruction(trained, split, row_loss, labels, names))
    return report


def classification(logits: np.ndarray, row_loss: np.ndarray, labels: np.ndarray, names: list[str]) -> dict:
    k = len(names)
    predicted = np.argmax(logits, axis=1)  # the first maximum, as the loss kernel counts a hit
    matrix = np.zeros((k, k), np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    per_class = [{"class": c, "name": names[c], "images": int(matrix[c].sum()),
                  "acc": float(matrix[c, c] / matrix[c].sum()) if matrix[c].sum() else None} for c in range(k)]
    return {"loss": float(row_loss.mean()) if len(labels) else None,
            "acc": float(np.mean(predicted == labels)) if len(labels) else None,
            "class_names": names, "per_class": per_class, "confusion_matrix": matrix.tolist()}


def reconstruction(trained: TrainedModel, split, row_loss: np.ndarray, labels: np.ndarray, names: list[str]) -> dict:
    per_class = []
    for c, name in enumerate(names):
        rows = labels == c
        per_class.append({"class": c, "name": name, "images": int(rows.sum()),
                          "mse": float(row_loss[rows].mean()) if rows.any() else None})
    return {"mse": float(row_loss.mean()) if len(labels) else None,
            "mean_image_mse": mean_image_mse(trained, split),
            "class_names": names, "per_class": per_class}


def mean_image_mse(trained: TrainedModel, split, chunk: int = 1000) -> float | None:
    """The MSE (pixels / 255) of predicting the mean training image for every image of `split`."""
    if not split.size:
        return None
    mean = trained.dataset.train_images.mean(axis=0, dtype=np.float64)[None] / 255.0
    mean = trained.model_rows(mean)[0]  # the split's rows are in the model's layout
    images, total = trained.backend.to_host(split.images), 0.0
    for start in range(0, split.size, chunk):
        rows = images[split.index[start:start + chunk]].astype(np.float64) / 255.0
        total += float(np.square(rows - mean).sum())
    return total / (split.size * mean.size)
