"""The training loop.

Per step: gather + normalise a batch on the device, forward, fused softmax
cross-entropy (forward and backward), backward into the flat gradient buffer,
then ONE optimizer update. Per-sample losses and hits land in device buffers
indexed by position in the epoch; the host reads them every
`train.log_every` steps, which is the loop's only synchronisation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.checkpoint import save_checkpoint
from mlptrain.config import Config, config_to_dict
from mlptrain.data.loader import ResidentSplit, epoch_order, resident_splits
from mlptrain.errors import UserError
from mlptrain.nn.mlp import MLP
from mlptrain.optim import make_optimizer, make_schedule
from mlptrain.tracking import RunLogger, console, training_progress, write_json


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


@dataclass
class Session:
    """Everything the loop works on, allocated once before the first step."""

    config: Config
    backend: object
    model: MLP
    optimizer: object
    schedule: object
    train: ResidentSplit
    val: ResidentSplit
    test: ResidentSplit
    scale: float  # pixel -> (pixel / 255 - mean) / std as one multiply-add
    shift: float
    order: object  # this epoch's training order (device int32), refilled in place so its address never changes
    row_loss: object  # per-sample loss of the current epoch (train) or evaluation
    row_correct: object
    eval_loss: object
    eval_correct: object

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.train.size // self.config.train.batch_size)


def build_session(config: Config, backend, dataset) -> Session:
    train, val, test = resident_splits(dataset, backend, config.data.val_size, config.seed)
    rows = max(config.train.batch_size, config.train.eval_batch_size)
    model = MLP(backend, dataset.train_images.shape[1], list(config.model.hidden), dataset.num_classes,
                config.model.activation, rows)
    model.init_parameters(np.random.default_rng(config.seed))
    eval_rows = max(val.size, test.size)
    return Session(
        config=config, backend=backend, model=model,
        optimizer=make_optimizer(config.optim, backend, model.params),
        schedule=make_schedule(config.schedule, config.optim.lr,
                               config.train.epochs * -(-train.size // config.train.batch_size)),
        train=train, val=val, test=test,
        scale=1.0 / (255.0 * dataset.std), shift=-dataset.mean / dataset.std,
        order=backend.empty((train.size,), np.int32),
        row_loss=backend.empty((train.size,)), row_correct=backend.empty((train.size,), np.int32),
        eval_loss=backend.empty((max(eval_rows, 1),)), eval_correct=backend.empty((max(eval_rows, 1),), np.int32),
    )


def train_step(s: Session, start: int, rows: int, lr: float) -> None:
    """One batch: the mean loss's gradient summed over the batch, then one optimizer update."""
    k = s.backend.kernels
    h, grad, labels = s.model.views(rows)
    k.data.gather_batch(s.train.images, s.train.labels, s.order, start, h[0], labels, s.scale, s.shift)
    logits = s.model.forward(rows)
    k.loss.softmax_cross_entropy(logits, labels, grad[-1], s.row_loss, s.row_correct, start, 1.0 / rows)
    s.model.backward(rows)
    s.optimizer.step(s.model.params.flat, s.model.grads.flat, lr)


def evaluate(s: Session, split: ResidentSplit) -> tuple[float, float]:
    """(mean loss, accuracy) over a whole split, in eval-sized batches."""
    k = s.backend.kernels
    batch = s.config.train.eval_batch_size
    for start in range(0, split.size, batch):
        rows = min(batch, split.size - start)
        h, grad, labels = s.model.views(rows)
        k.data.gather_batch(split.images, split.labels, split.device_index, start, h[0], labels, s.scale, s.shift)
        logits = s.model.forward(rows)
        k.loss.softmax_cross_entropy(logits, labels, grad[-1], s.eval_loss, s.eval_correct, start, 0.0)
    if split.size == 0:
        return float("nan"), float("nan")
    return _mean_loss_and_accuracy(s.backend, s.eval_loss, s.eval_correct, 0, split.size)


def checkpoint_arrays(s: Session, epoch: int, best_val_acc: float) -> dict[str, np.ndarray]:
    arrays = s.model.params.to_host_dict(prefix="params/")
    arrays.update(s.optimizer.state_dict())
    arrays["meta/epoch"] = np.array(epoch, np.int64)
    arrays["meta/seed"] = np.array(s.config.seed, np.int64)
    arrays["meta/best_val_acc"] = np.array(best_val_acc, np.float64)
    return arrays


def _mean_loss_and_accuracy(backend, row_loss, row_correct, lo: int, hi: int) -> tuple[float, float]:
    """Reads per-sample results [lo, hi) to the host (a synchronisation) and averages them in float64."""
    loss = backend.to_host(row_loss[lo:hi]).astype(np.float64).mean()
    acc = backend.to_host(row_correct[lo:hi]).mean()
    return float(loss), float(acc)


def train(config: Config, backend, dataset, run_dir: Path, on_evaluation=None) -> dict:
    """Train, evaluate each epoch, checkpoint, and return the summary written to summary.json.

    `on_evaluation(record)`, when given, is called after each epoch's evaluation with the record
    written to metrics.jsonl (epoch, step, val_*/test_* metrics); an exception it raises stops the
    run there (a sweep prunes a trial this way) after that epoch's checkpoint is written."""
    t_start = time.perf_counter()
    s = build_session(config, backend, dataset)
    console.print(f"[bold]{run_dir.name}[/]: {s.model.layout.size:,} parameters on {backend.device_name}; "
                  f"{s.train.size:,} train / {s.val.size:,} val / {s.test.size:,} test; "
                  f"batch {config.train.batch_size}, {s.steps_per_epoch} steps per epoch")
    logger = RunLogger(run_dir)
    try:
        last, best_val_acc, train_seconds, samples_seen, median_rate = fit(s, logger, run_dir, on_evaluation)
        summary = {
            "run": run_dir.name, "backend": backend.name, "device": backend.device_name,
            "parameters": s.model.layout.size, **{k: v for k, v in last.items() if k != "step"},
            "best_val_acc": best_val_acc, "epochs": config.train.epochs,
            "optimizer_steps": s.optimizer.step_count, "batch_size": config.train.batch_size,
            # the median over metric windows: the steady state, without the first launches' JIT compilation
            "samples_per_s": median_rate, "mean_samples_per_s": samples_seen / train_seconds,
            "train_s": train_seconds,
            "wall_s": time.perf_counter() - t_start,
        }
        logger.hparams(_flat_hparams(config), {"test_acc": summary["test_acc"], "val_acc": summary["val_acc"]})
    finally:
        logger.close()
    write_json(run_dir / "summary.json", summary)
    return summary


def train_epoch(s: Session, epoch: int, on_read) -> None:
    """Every step of one epoch. Each `train.log_every` steps, and at the epoch's end, the host reads the
    window's per-sample losses (the loop's only synchronisation) and hands `on_read` a dict of
    epoch, step, lr, loss, acc, samples and seconds for that window."""
    config, batch = s.config, s.config.train.batch_size
    s.backend.copy_from_host(s.order, epoch_order(s.train, config.seed, epoch))
    s.backend.synchronize()
    t_window, read_from = time.perf_counter(), 0
    for i, start in enumerate(range(0, s.train.size, batch)):
        rows = min(batch, s.train.size - start)
        lr = s.schedule(s.optimizer.step_count)
        train_step(s, start, rows, lr)
        if (i + 1) % config.train.log_every and i + 1 != s.steps_per_epoch:
            continue
        loss, acc = _mean_loss_and_accuracy(s.backend, s.row_loss, s.row_correct, read_from, start + rows)
        on_read({"epoch": epoch, "step_in_epoch": i + 1, "step": s.optimizer.step_count, "lr": lr, "loss": loss,
                 "acc": acc, "samples": start + rows - read_from, "seconds": time.perf_counter() - t_window})
        t_window, read_from = time.perf_counter(), start + rows


def fit(s: Session, logger: RunLogger, run_dir: Path, on_evaluation=None):
    """The epochs. Returns (last evaluation, best val acc, seconds in training steps, samples trained,
    median samples/s over the metric windows)."""
    totals = {"seconds": 0.0, "samples": 0, "rates": []}
    with training_progress() as progress:
        task = progress.add_task("train", total=s.config.train.epochs * s.steps_per_epoch, epoch=1,
                                 loss=float("nan"), acc=float("nan"), rate=0.0)

        def on_read(w):
            if not np.isfinite(w["loss"]):
                raise TrainingDiverged(
                    f"the training loss became {w['loss']} at optimizer step {w['step']} (epoch {w['epoch']}); "
                    f"the learning rate optim.lr={s.config.optim.lr} is likely too high")
            rate = w["samples"] / w["seconds"]
            totals["seconds"] += w["seconds"]
            totals["samples"] += w["samples"]
            totals["rates"].append(rate)
            logger.scalars(w["step"], {"train/loss": w["loss"], "train/acc": w["acc"], "opt/lr": w["lr"],
                                       "perf/samples_per_s": rate})
            progress.update(task, completed=(w["epoch"] - 1) * s.steps_per_epoch + w["step_in_epoch"],
                            epoch=w["epoch"], loss=w["loss"], acc=w["acc"], rate=rate)

        best_val_acc, last = -1.0, {}
        for epoch in range(1, s.config.train.epochs + 1):
            train_epoch(s, epoch, on_read)
            last = _end_of_epoch(s, logger, run_dir, epoch, best_val_acc)
            best_val_acc = max(best_val_acc, last["val_acc"])
            if on_evaluation is not None:
                on_evaluation(last)
    return last, best_val_acc, totals["seconds"], totals["samples"], float(np.median(totals["rates"]))


def _end_of_epoch(s: Session, logger: RunLogger, run_dir: Path, epoch: int, best_val_acc: float) -> dict:
    """Evaluate on val and test, log, and write the `last` (and maybe `best`) checkpoint."""
    val_loss, val_acc = evaluate(s, s.val)
    test_loss, test_acc = evaluate(s, s.test)
    step = s.optimizer.step_count
    record = {"epoch": epoch, "step": step, "val_loss": val_loss, "val_acc": val_acc,
              "test_loss": test_loss, "test_acc": test_acc}
    logger.scalars(step, {"val/loss": val_loss, "val/acc": val_acc, "test/loss": test_loss, "test/acc": test_acc})
    logger.evaluation(record)
    console.print(f"epoch {epoch}: val loss {val_loss:.4f} acc {val_acc:.4f} | test loss {test_loss:.4f} "
                  f"acc {test_acc:.4f}")
    if not np.isfinite(val_loss) and s.val.size:
        raise TrainingDiverged(f"the validation loss became {val_loss} after epoch {epoch}; "
                               f"the learning rate optim.lr={s.config.optim.lr} is likely too high")
    is_best = val_acc > best_val_acc
    save_last = epoch % s.config.train.checkpoint_every_epochs == 0 or epoch == s.config.train.epochs
    if save_last or is_best:
        arrays = checkpoint_arrays(s, epoch, max(best_val_acc, val_acc))
        if save_last:
            save_checkpoint(run_dir / "checkpoints" / "last.npz", arrays)
        if is_best:
            save_checkpoint(run_dir / "checkpoints" / "best.npz", arrays)
    return record


def _flat_hparams(config: Config) -> dict:
    flat = {}
    for section, values in config_to_dict(config).items():
        if isinstance(values, dict):
            for key, value in values.items():
                flat[f"{section}.{key}"] = str(value) if isinstance(value, (list, type(None))) else value
        elif section != "description":
            flat[section] = values
    return flat
