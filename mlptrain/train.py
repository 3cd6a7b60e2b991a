"""The training loop.

An epoch is a sequence of windows of `batch_size * grad_accum_steps` samples
taken in the epoch's order (a function of seed and epoch only, so the windows
do not depend on how they are split). Per window: for each micro-batch,
gather + normalise it on the device, forward, fused softmax cross-entropy
(forward and backward, its gradient scaled by 1 / samples in the window), and
backward adding into the flat float32 gradient buffer; then ONE optimizer step
(`OptimizerStep`: norm, device-side loss scaling / skip / clipping / lr, fused
update). Per-sample losses and hits land in device buffers indexed by
position in the epoch; the host reads them, and the step state, every
`train.log_every` optimizer steps: the loop's only synchronisation.

Checkpoints record the position (epoch, window) and everything that evolves, so a run stopped by
Ctrl-C or SIGTERM (after the step in flight) resumes bitwise where it stopped: see mlptrain.resume.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.checkpoint import save_checkpoint
from mlptrain.config import Config, config_to_dict
from mlptrain.data.loader import ResidentSplit, epoch_order, resident_splits
from mlptrain.errors import TrainingDiverged, TrainingInterrupted
from mlptrain.nn import input_scale_shift, make_model, model_dataset
from mlptrain.precision import to_float32
from mlptrain.optim import LossScaling, OptimizerStep, Plateau, lr_table, make_optimizer, make_schedule
from mlptrain.resume import Position, Resume, checkpoint_arrays, restore
from mlptrain.runs import write_yaml
from mlptrain.tracking import RunLogger, console, training_progress, write_json


@dataclass
class Session:
    """Everything the loop works on, allocated once before the first step."""

    config: Config
    backend: object
    model: object  # mlptrain.nn.MLP or ConvAutoencoder
    step: OptimizerStep
    plateau: Plateau | None
    train: ResidentSplit
    val: ResidentSplit
    test: ResidentSplit
    scale: float  # pixel -> (pixel / 255 - mean) / std (classifiers) or pixel / 255 (autoencoder), one multiply-add
    shift: float
    order: object  # this epoch's training order (device int32), refilled in place so its address never changes
    row_loss: object  # per-sample loss of the current epoch (train) or evaluation
    row_correct: object
    eval_loss: object
    eval_correct: object
    unit_scale: object  # a loss scale of 1 for evaluation, whose gradient is discarded
    cursor: object  # the window's start in the epoch's order (device int64[1]): a graph replay reads and advances it
    stop: object = None  # a StopOnSignal (or anything with `signum`), read after each optimizer step
    cursor_at: int | None = None  # where the device cursor stands after the launches queued so far
    graph: object = None  # the full window's launches as one CUDA graph (see train_step)
    graph_tried: bool = False

    @property
    def stop_requested(self) -> bool:
        return self.stop is not None and bool(self.stop.signum)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps (windows) per epoch: ceil(micro-batches / grad_accum_steps)."""
        return steps_per_epoch(self.train.size, self.config.train)

    @property
    def classifies(self) -> bool:
        """A classifier reports loss and accuracy; the autoencoder its reconstruction MSE."""
        return self.model.task == "classification"

    @property
    def selection(self) -> tuple[str, bool]:
        """The validation metric that picks the `best` checkpoint, and whether higher is better."""
        return ("val_acc", True) if self.classifies else ("val_mse", False)


def steps_per_epoch(train_size: int, train_config) -> int:
    micro_batches = -(-train_size // train_config.batch_size)
    return -(-micro_batches // train_config.grad_accum_steps)


def build_session(config: Config, backend, dataset) -> Session:
    dataset = model_dataset(config, dataset)
    train, val, test = resident_splits(dataset, backend, config.data.val_size, config.seed)
    rows = max(config.train.batch_size, config.train.eval_batch_size)
    model = make_model(config, backend, dataset, rows)
    model.init_parameters(np.random.default_rng(config.seed))
    eval_rows = max(val.size, test.size)
    per_epoch = steps_per_epoch(train.size, config.train)
    total_steps = config.train.epochs * per_epoch
    schedule = make_schedule(config.schedule, config.optim.lr, total_steps, per_epoch)
    scale, shift = input_scale_shift(model, dataset)
    loss_scaling = LossScaling(**vars(config.train.loss_scale)) if config.train.precision == "fp16" else None
    step = OptimizerStep(make_optimizer(config.optim, backend, model.params), backend,
                         lr_table(schedule, total_steps), total_steps, config.train.clip_grad_norm, loss_scaling)
    return Session(
        config=config, backend=backend, model=model, step=step,
        plateau=Plateau(config.schedule, config.optim.lr) if config.schedule.name == "plateau" else None,
        train=train, val=val, test=test,
        scale=scale, shift=shift,
        order=backend.empty((train.size,), np.int32),
        row_loss=backend.empty((train.size,)), row_correct=backend.empty((train.size,), np.int32),
        eval_loss=backend.empty((max(eval_rows, 1),)), eval_correct=backend.empty((max(eval_rows, 1),), np.int32),
        unit_scale=backend.to_device(np.ones(1, np.float64)),
        cursor=backend.zeros((1,), np.int64),
    )


def train_step(s: Session, start: int, rows: int) -> None:
    """One optimizer step over the window of `rows` samples at `start` in the epoch's order: its
    micro-batches add up the gradient of the window's mean loss (so the update equals one batch of
    `rows`), then one update.

    The window's position is read on the device from `s.cursor`, which the step advances on the device,
    so consecutive windows need no host copy (a copy from pageable memory would wait for the GPU). On a
    GPU, the first full window runs launch by launch (compiling the kernels), then its launches are
    captured as one CUDA graph that every later full window replays: the same kernels with the same
    arguments, so the results are bitwise those of launching them one by one."""
    if s.cursor_at != start:
        s.backend.copy_from_host(s.cursor, np.array([start], np.int64))
    full = rows == s.config.train.effective_batch_size
    if full and s.graph is not None:
        s.graph.replay()
    else:
        _window_launches(s, rows)
        if full and s.config.train.cuda_graphs and not s.graph_tried:
            s.graph_tried = True
            try:
                s.graph = s.backend.capture(lambda: _window_launches(s, rows))
            except RuntimeError as err:  # the driver refused the capture: launch one by one, as without graphs
                console.print(f"[yellow]warning:[/] no CUDA graph ({err}); launching kernels one by one")
    s.cursor_at = start + rows


def _window_launches(s: Session, rows: int) -> None:
    """The launches of one window of `rows` samples at the device cursor, which the last one advances."""
    k = s.backend.kernels
    batch = s.config.train.batch_size
    for offset in range(0, rows, batch):
        n = min(batch, rows - offset)
        x, labels = s.model.batch(n)
        k.data.gather_batch(s.train.images, s.train.labels, s.order, offset, x, labels, s.scale, s.shift, s.cursor)
        s.model.forward(n)
        s.model.loss(n, s.row_loss, s.row_correct, offset, 1.0 / rows, s.step.loss_scale, s.cursor)
        s.model.backward(n, beta=0.0 if offset == 0 else 1.0)
    s.step(s.model.params.flat, s.model.grads.flat, s.model.compute.flat)
    k.data.advance_cursor(s.cursor, rows)


def evaluate(s: Session, split: ResidentSplit) -> tuple[float, float]:
    """(mean loss, accuracy) over a whole split, in eval-sized batches; for the autoencoder the loss
    is the reconstruction MSE and the accuracy NaN."""
    k = s.backend.kernels
    batch = s.config.train.eval_batch_size
    for start in range(0, split.size, batch):
        rows = min(batch, split.size - start)
        x, labels = s.model.batch(rows)
        k.data.gather_batch(split.images, split.labels, split.device_index, start, x, labels, s.scale, s.shift)
        s.model.forward(rows)
        s.model.loss(rows, s.eval_loss, s.eval_correct, start, 0.0, s.unit_scale)
    if split.size == 0:
        return float("nan"), float("nan")
    return _mean_loss_and_accuracy(s, s.eval_loss, s.eval_correct, 0, split.size)


def _mean_loss_and_accuracy(s: Session, row_loss, row_correct, lo: int, hi: int) -> tuple[float, float]:
    """Reads per-sample results [lo, hi) to the host (a synchronisation) and averages them in float64
    (the accuracy is NaN for a model without one)."""
    loss = s.backend.to_host(row_loss[lo:hi]).astype(np.float64).mean()
    acc = s.backend.to_host(row_correct[lo:hi]).mean() if s.classifies else np.nan
    return float(loss), float(acc)


def train(config: Config, backend, dataset, run_dir: Path, on_evaluation=None, resume: Resume | None = None,
          stop=None) -> dict:
    """Train, evaluate each epoch, checkpoint, and return the summary written to summary.json.

    `on_evaluation(record)`, when given, is called after each epoch's evaluation with the record
    written to metrics.jsonl (epoch, step, val_*/test_* metrics); an exception it raises stops the
    run there (a sweep prunes a trial this way) after that epoch's checkpoint is written.
    `resume` continues from a checkpoint of this run (mlptrain.resume.prepare_resume). When
    `stop.signum` becomes set, the loop writes `last` after the current optimizer step and raises
    TrainingInterrupted. On a resumed run the summary's timings cover the resumed part only."""
    t_start = time.perf_counter()
    s = build_session(config, backend, dataset)
    s.stop = stop
    start = Position()
    if resume is not None:
        # before anything is written: a mismatched checkpoint changes nothing
        start = restore(resume, s.model, s.step, s.plateau, s.selection[0], s.steps_per_epoch)
        write_yaml(run_dir / "config.yaml", config_to_dict(config))  # train.epochs may have grown
        console.print(f"resuming {run_dir} after epoch {start.epoch}"
                      f"{f' and {start.window} steps' if start.window else ''}")
    t = config.train
    console.print(f"[bold]{run_dir.name}[/]: {s.model.layout.size:,} parameters on {backend.device_name}, "
                  f"{t.precision}; {s.train.size:,} train / {s.val.size:,} val / {s.test.size:,} test; "
                  f"effective batch {t.effective_batch_size} (batch {t.batch_size} x {t.grad_accum_steps} "
                  f"accumulated), {s.steps_per_epoch} optimizer steps per epoch")
    logger = RunLogger(run_dir)
    try:
        last, best, totals = fit(s, logger, run_dir, on_evaluation, start)
        state = s.step.read()
        summary = {
            "run": run_dir.name, "backend": backend.name, "device": backend.device_name,
            "parameters": s.model.layout.size, "precision": t.precision,
            **{k: v for k, v in last.items() if k != "step"},
            f"best_{s.selection[0]}": best, "epochs": t.epochs,
            "optimizer_steps": state["steps"], "skipped_steps": state["skipped"],
            "loss_scale": state["loss_scale"] if t.precision == "fp16" else None,
            "batch_size": t.batch_size, "grad_accum_steps": t.grad_accum_steps,
            "effective_batch_size": t.effective_batch_size,
            # the median over metric windows: the steady state, without the first launches' JIT compilation
            "samples_per_s": float(np.median(totals["rates"])),
            "mean_samples_per_s": totals["samples"] / totals["seconds"],
            "train_s": totals["seconds"],
            "wall_s": time.perf_counter() - t_start,
            "grad_norm_history": [float(x) for x in s.step.grad_norm_history(0, state["windows"])],
        }
        if not s.classifies:
            summary["mean_image_mse"] = mean_image_mse(dataset)
        hparams = {**_flat_hparams(config), "train.effective_batch_size": t.effective_batch_size}
        finals = ("test_acc", "val_acc", "test_loss", "val_loss") if s.classifies else ("test_mse", "val_mse")
        logger.hparams(hparams, {key: summary[key] for key in finals})
    finally:
        logger.close()
    write_json(run_dir / "summary.json", summary)
    return summary


def train_epoch(s: Session, epoch: int, on_read, first_window: int = 0) -> int:
    """The optimizer steps of one epoch from window `first_window` (a resumed run's position) on. Each
    `train.log_every` steps, and at the epoch's end, the host reads the per-sample losses since the
    last read and the step state (the loop's only synchronisation) and hands `on_read` a dict of
    epoch, step_in_epoch, step (optimizer steps applied), lr, grad_norm, loss_scale, skipped, loss,
    acc, samples and seconds. Returns the windows done: fewer than `s.steps_per_epoch` when a stop
    was requested."""
    config, window = s.config, s.config.train.effective_batch_size
    s.backend.copy_from_host(s.order, epoch_order(s.train, config.seed, epoch))
    s.backend.synchronize()
    t_window, read_from = time.perf_counter(), first_window * window
    for i in range(first_window, s.steps_per_epoch):
        start = i * window
        rows = min(window, s.train.size - start)
        train_step(s, start, rows)
        if (i + 1) % config.train.log_every == 0 or i + 1 == s.steps_per_epoch:
            t_window, read_from = _read(s, epoch, i, read_from, start + rows, t_window, on_read)
        if s.stop_requested and i + 1 < s.steps_per_epoch:  # a Python attribute: no synchronisation
            return i + 1
    return s.steps_per_epoch


def _read(s: Session, epoch: int, i: int, read_from: int, read_to: int, t_window: float, on_read):
    """Hand `on_read` the metrics of samples [read_from, read_to) of the epoch; returns the next
    window's (start time, read_from)."""
    loss, acc = _mean_loss_and_accuracy(s, s.row_loss, s.row_correct, read_from, read_to)
    state = s.step.read()
    on_read({"epoch": epoch, "step_in_epoch": i + 1, "step": state["steps"], "lr": state["lr"],
             "grad_norm": state["grad_norm"], "loss_scale": state["loss_scale"], "skipped": state["skipped"],
             "loss": loss, "acc": acc, "samples": read_to - read_from, "seconds": time.perf_counter() - t_window})
    return time.perf_counter(), read_to


def fit(s: Session, logger: RunLogger, run_dir: Path, on_evaluation=None, start: Position = Position()):
    """The epochs after `start`. Returns (last evaluation, best val acc, totals: seconds in training
    steps, samples trained and the samples/s of each metric window)."""
    totals = {"seconds": 0.0, "samples": 0, "rates": []}
    with training_progress() as progress:
        task = progress.add_task("train", total=s.config.train.epochs * s.steps_per_epoch, epoch=start.epoch + 1,
                                 completed=start.epoch * s.steps_per_epoch + start.window,
                                 loss=float("nan"), acc="", rate=0.0)

        def on_read(w):
            if not np.isfinite(w["loss"]):
                raise TrainingDiverged(
                    f"the training loss became {w['loss']} at optimizer step {w['step']} (epoch {w['epoch']}); "
                    f"the learning rate optim.lr={s.config.optim.lr} is likely too high")
            rate = w["samples"] / w["seconds"]
            totals["seconds"] += w["seconds"]
            totals["samples"] += w["samples"]
            totals["rates"].append(rate)
            scalars = {"train/loss": w["loss"], "opt/lr": w["lr"], "opt/grad_norm": w["grad_norm"],
                       "perf/samples_per_s": rate}
            if s.classifies:
                scalars["train/acc"] = w["acc"]
            if s.config.train.precision == "fp16":
                scalars.update({"amp/loss_scale": w["loss_scale"], "amp/skipped_steps": w["skipped"]})
            logger.scalars(w["step"], scalars)
            progress.update(task, completed=(w["epoch"] - 1) * s.steps_per_epoch + w["step_in_epoch"],
                            epoch=w["epoch"], loss=w["loss"], acc=f"acc {w['acc']:.4f}" if s.classifies else "",
                            rate=rate)

        best, last = start.best, {}
        key, higher_is_better = s.selection
        for epoch in range(start.epoch + 1, s.config.train.epochs + 1):
            done = train_epoch(s, epoch, on_read, start.window if epoch == start.epoch + 1 else 0)
            if done < s.steps_per_epoch:
                _stop(s, run_dir, Position(epoch - 1, done, best))
            last = _end_of_epoch(s, logger, run_dir, epoch, best)
            if best is None or (last[key] > best if higher_is_better else last[key] < best):
                best = last[key]
            if on_evaluation is not None:
                on_evaluation(last)
            if s.stop_requested and epoch < s.config.train.epochs:
                _stop(s, run_dir, Position(epoch, 0, best))
    return last, best, totals


def _stop(s: Session, run_dir: Path, position: Position) -> None:
    """Write `last` at `position` (after the optimizer step just finished) and raise TrainingInterrupted."""
    save_checkpoint(run_dir / "checkpoints" / "last.npz", _checkpoint(s, position))
    epoch = position.epoch + (1 if position.window else 0)
    raise TrainingInterrupted(f"interrupted at epoch {epoch} step {s.step.read()['steps']}; "
                              f"resume with: mlptrain run --resume {run_dir}", s.stop.signum)


def _checkpoint(s: Session, position: Position) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint of `s` at `position` (see mlptrain.resume.checkpoint_arrays)."""
    return checkpoint_arrays(s.model, s.step, s.plateau, position, s.config, s.selection[0])


def _end_of_epoch(s: Session, logger: RunLogger, run_dir: Path, epoch: int, best: float | None) -> dict:
    """Evaluate on val and test, log, and write the `last` (and maybe `best`) checkpoint."""
    val_loss, val_acc = evaluate(s, s.val)
    test_loss, test_acc = evaluate(s, s.test)
    step = s.step.read()["steps"]
    if s.classifies:
        record = {"epoch": epoch, "step": step, "val_loss": val_loss, "val_acc": val_acc,
                  "test_loss": test_loss, "test_acc": test_acc}
        logger.scalars(step, {"val/loss": val_loss, "val/acc": val_acc, "test/loss": test_loss,
                              "test/acc": test_acc})
        console.print(f"epoch {epoch}: val loss {val_loss:.4f} acc {val_acc:.4f} | test loss {test_loss:.4f} "
                      f"acc {test_acc:.4f}")
    else:
        record = {"epoch": epoch, "step": step, "val_mse": val_loss, "test_mse": test_loss}
        logger.scalars(step, {"val/mse": val_loss, "test/mse": test_loss})
        logger.image("test/reconstructions", _reconstruction_grid(s), step)
        console.print(f"epoch {epoch}: val mse {val_loss:.5f} | test mse {test_loss:.5f}")
    logger.evaluation(record)
    if not np.isfinite(val_loss) and s.val.size:
        raise TrainingDiverged(f"the validation loss became {val_loss} after epoch {epoch} (optimizer step "
                               f"{step}); the learning rate optim.lr={s.config.optim.lr} is likely too high")
    if s.plateau is not None:  # before the checkpoint, which must hold the plateau's state after this epoch
        metric = s.config.schedule.metric if s.classifies else "val_mse"
        s.step.set_lr_factor(s.plateau.observe(record[metric]))
    key, higher_is_better = s.selection
    is_best = best is None or (record[key] > best if higher_is_better else record[key] < best)
    save_last = epoch % s.config.train.checkpoint_every_epochs == 0 or epoch == s.config.train.epochs
    if save_last or is_best:
        arrays = _checkpoint(s, Position(epoch, 0, record[key] if is_best else best))
        if save_last:
            save_checkpoint(run_dir / "checkpoints" / "last.npz", arrays)
        if is_best:
            save_checkpoint(run_dir / "checkpoints" / "best.npz", arrays)
    return record


def mean_image_mse(dataset) -> float:
    """The baseline a reconstruction must beat: the test MSE (pixels / 255) of predicting the mean training
    image for every test image."""
    mean = dataset.train_images.mean(axis=0, dtype=np.float64) / 255.0
    return float(np.mean((dataset.test_images / 255.0 - mean) ** 2))


def _reconstruction_grid(s: Session, count: int = 8) -> np.ndarray:
    """The first `count` test images (top row) above their reconstructions, (2H, count*W, C) in [0, 1]."""
    rows = min(count, s.test.size)
    x, labels = s.model.batch(rows)
    s.backend.kernels.data.gather_batch(s.test.images, s.test.labels, s.test.device_index, 0, x, labels,
                                        s.scale, s.shift)
    s.model.forward(rows)
    h, w, c = s.model.height, s.model.width, s.model.image_channels
    images = to_float32(s.backend.to_host(x)).reshape(rows, h, w, c)
    recon = to_float32(s.backend.to_host(s.model.reconstruction(rows))).reshape(rows, h, w, c)
    grid = np.concatenate([np.concatenate(list(images), axis=1), np.concatenate(list(recon), axis=1)], axis=0)
    return np.clip(grid, 0.0, 1.0)


def _flat_hparams(config: Config) -> dict:
    """Dotted keys to scalar values (lists and None as text), for TensorBoard's HParams dashboard."""
    def flatten(values: dict, prefix: str):
        for key, value in values.items():
            if isinstance(value, dict):
                yield from flatten(value, f"{prefix}{key}.")
            elif key != "description":
                yield prefix + key, str(value) if isinstance(value, (list, type(None))) else value

    return dict(flatten(config_to_dict(config), ""))
