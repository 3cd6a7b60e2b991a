"""What the host does with each metric read of the training loop (every `train.log_every` optimizer
steps and at each epoch's end, the loop's only synchronisation): stop on a non-finite loss, log the
scalars, move the progress bar, and keep the throughput the run summary reports."""

from __future__ import annotations

import bisect
import time

import numpy as np

from mlptrain.errors import TrainingDiverged
from mlptrain.run_dirs.records import metric_tag
from mlptrain.training.diagnosis import likely_cause
from mlptrain.training.progress import training_progress
from mlptrain.util.console import console


class TrainingMonitor:
    """A context (the progress bar's lifetime) that is called with each read: a dict of epoch,
    step_in_epoch, step, lr, grad_norm, loss_scale, skipped, loss, acc, samples and seconds."""

    def __init__(self, logger, config, steps_per_epoch: int, classifies: bool, epoch: int = 0, window: int = 0,
                 bar: bool = True):
        """`epoch` epochs and `window` steps of the next are done already (a resumed run); `bar`: show the
        progress bar (a terminal holds one at a time)."""
        self.logger, self.config, self.per_epoch, self.classifies = logger, config, steps_per_epoch, classifies
        self.bar = bar
        self.done = (epoch, window)
        # time in training steps, samples, and each read's rate kept sorted: the bar shows their median at
        # every read, which a sort of them all each time would make grow with the run
        self.seconds, self.samples, self.rates = 0.0, 0, []

    def __enter__(self) -> "TrainingMonitor":
        epoch, window = self.done
        self.progress = training_progress(console, show=self.bar).__enter__()
        self.started, self.steps_at_start = time.monotonic(), epoch * self.per_epoch + window
        self.task = self.progress.add_task("train", total=self.per_epoch, completed=window, epoch=epoch + 1,
                                           epochs=self.config.train.epochs, loss=None, acc=None, rate=0.0,
                                           ends_at=None, stopped=False)
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # Ctrl-C, a diverged loss: `eta 0:00:00` would say the run is done
            self.progress.update(self.task, stopped=True)
        else:  # finished, or ended early by early stopping: nothing left to wait for
            self.progress.update(self.task, ends_at=time.monotonic())
        self.progress.__exit__(*exc)

    def stopped_at(self, step_in_epoch: int) -> None:
        """The loop stopped after this epoch's optimizer step `step_in_epoch` (a stop between reads): the bar
        counts the steps that ran, as the interruption's message does."""
        self.progress.update(self.task, completed=step_in_epoch)

    def __call__(self, w: dict) -> None:
        if not np.isfinite(w["loss"]):
            raise TrainingDiverged(
                f"the training loss became {w['loss']} at optimizer step {w['step']} (epoch {w['epoch']}); "
                f"{likely_cause(self.config, w)}")
        rate = w["samples"] / w["seconds"]
        self.seconds += w["seconds"]
        self.samples += w["samples"]
        bisect.insort(self.rates, rate)
        scalars = {metric_tag("train_loss" if self.classifies else "train_mse"): w["loss"], "opt/lr": w["lr"],
                   "opt/grad_norm": w["grad_norm"], "perf/samples_per_s": rate}
        if self.classifies:
            scalars[metric_tag("train_acc")] = w["acc"]
        if self.config.train.precision == "fp16":  # beside the rate and the norm it moves
            scalars.update({"opt/loss_scale": w["loss_scale"], "opt/skipped_steps": w["skipped"]})
        self.logger.scalars(w["step"], scalars)
        done = (w["epoch"] - 1) * self.per_epoch + w["step_in_epoch"]
        # the run's average pace since this process started training (evaluations included): a steady ETA
        pace = (time.monotonic() - self.started) / max(done - self.steps_at_start, 1)
        remaining = self.config.train.epochs * self.per_epoch - done
        self.progress.update(self.task, completed=w["step_in_epoch"], epoch=w["epoch"], loss=w["loss"],
                             acc=w["acc"] if self.classifies else None, rate=self.throughput()["samples_per_s"],
                             ends_at=time.monotonic() + remaining * pace)

    def throughput(self) -> dict:
        """summary.json's samples_per_s (the median over reads: the steady state, without the first
        launches' JIT compilation), mean_samples_per_s and train_s."""
        if not self.rates:  # a resumed run that only had its summary left to write
            return {"samples_per_s": None, "mean_samples_per_s": None, "train_s": 0.0}
        n, rates = len(self.rates), self.rates
        median = rates[n // 2] if n % 2 else (rates[n // 2 - 1] + rates[n // 2]) / 2  # as np.median
        return {"samples_per_s": float(median), "mean_samples_per_s": self.samples / self.seconds,
                "train_s": self.seconds}
