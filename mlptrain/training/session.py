"""What a training run works on, built once before anything is written: the model, its optimizer step,
the data resident on the device, and the buffers of the training window and of evaluation.

Building it is where a config meets its data and its model, so every refusal of that meeting (a model
the dataset cannot feed, a validation split too large, ...) happens here, before a run directory exists.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from mlptrain.config.schema import Config, init_scheme, steps_per_epoch
from mlptrain.data.loader import ResidentSplit, check_trainable, resident_splits, val_size_note
from mlptrain.nn import check_trainable_labels, input_scale_shift, make_model, model_dataset
from mlptrain.optim import LossScaling, OptimizerStep, Plateau, lr_table, make_optimizer, make_schedule
from mlptrain.training.evaluation import Evaluator
from mlptrain.training.fallbacks import subset_note, warn
from mlptrain.training.memory_plan import buffer_rows, check_fits
from mlptrain.training.resume import HeldCheckpoint
from mlptrain.training.window import TrainingWindow


@dataclass
class Session:
    """Everything the loop works on, allocated once before the first step."""

    config: Config
    backend: object
    dataset: object  # the ImageDataset as loaded (the summary's dataset record and baselines read it)
    model: object  # mlptrain.nn.MLP or ConvAutoencoder
    step: OptimizerStep
    plateau: Plateau | None
    train: ResidentSplit
    val: ResidentSplit
    test: ResidentSplit
    window: TrainingWindow
    evaluator: Evaluator
    started: float = field(default_factory=time.perf_counter)  # when building began: wall_s counts from here
    stop: object = None  # a StopOnSignal (or anything with `signum`), read after each optimizer step
    notes: list = field(default_factory=list)  # fallbacks found after building (kernels: mlptrain.training.compilation)
    wall_before: float = 0.0  # seconds a resumed run spent before this process (its checkpoint's meta/wall_s)
    unsaved_best: HeldCheckpoint | None = None  # the best epoch's checkpoint, written with the next `last`
    writing: Future | None = None  # the run's checkpoint files on their way to the disk (training.checkpoint_writes)
    best_ahead: Future | None = None  # unsaved_best's file written ahead of `last` (training.checkpoint_writes)

    @property
    def fallbacks(self) -> list[str]:
        """What runs instead of what was asked, known before the first step: the backend's (auto on the
        CPU) and the dataset's (a subset; files skipped or converted; a decoded-data cache that could not be used). mlptrain.training.fallbacks
        says which others there are."""
        source = self.dataset.provenance
        notes = (*self.backend.fallbacks, subset_note(self.dataset), source.read_note, source.cache_note)
        return [note for note in notes if note]

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
        """The validation metric that picks the `best` checkpoint, and whether higher is better: early
        stopping's when it is on (so that restoring the best epoch restores `best`), else val_acc (val_mse
        for the autoencoder)."""
        if not self.classifies:
            return "val_mse", False
        if self.stopping is not None and self.stopping.metric == "val_loss":
            return "val_loss", False
        return "val_acc", True

    @property
    def stopping(self):
        """The early stopping config, or None when it is off."""
        stopping = self.config.train.early_stopping
        return stopping if stopping.patience is not None else None


def build_session(config: Config, backend, dataset) -> Session:
    """The session of `config` on `backend`; raises UserError where the config, the data and the model
    do not fit together."""
    started = time.perf_counter()
    check_trainable(dataset)
    check_trainable_labels(config.model, dataset)
    note = val_size_note(dataset, config.data.val_size)
    if note:
        warn(note)
    loaded, dataset = dataset, model_dataset(config, dataset)
    check_fits(config, backend, dataset)  # before the first allocation
    train, val, test = resident_splits(dataset, backend, config.data.val_size, config.seed)
    rows = buffer_rows(config, train.size, max(val.size, test.size))
    model = make_model(config, backend, dataset, rows)
    model.init_seeded(config.seed, *init_scheme(config.model))
    per_epoch = steps_per_epoch(train.size, config.train)
    total_steps = config.train.epochs * per_epoch
    schedule = make_schedule(config.schedule, config.optim.lr, total_steps, per_epoch)
    # pixel -> (pixel / 255 - mean) / std (classifiers) or pixel / 255 (autoencoder), one multiply-add
    scale, shift = input_scale_shift(model, dataset)
    loss_scaling = LossScaling(**vars(config.train.loss_scale)) if config.train.precision == "fp16" else None
    step = OptimizerStep(make_optimizer(config.optim, backend, model.params), backend,
                         lr_table(schedule, total_steps), total_steps, config.train.clip_grad_norm, loss_scaling)
    return Session(
        config=config, backend=backend, dataset=loaded, model=model, step=step,
        plateau=Plateau(config.schedule, config.optim.lr) if config.schedule.name == "plateau" else None,
        train=train, val=val, test=test,
        window=TrainingWindow(backend, model, step, train, scale, shift, config.train),
        evaluator=Evaluator(backend, model, config.train.eval_batch_size, max(val.size, test.size), scale, shift,
                            config.train.cuda_graphs,
                            every_epoch=(val, test) if config.train.eval_test == "every_epoch" else (val,)),
        started=started,
    )
