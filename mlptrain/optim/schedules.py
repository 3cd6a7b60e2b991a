"""Learning-rate schedules: pure functions of the 0-based optimizer step, registered by name.

`make_schedule` turns the `schedule` config section into one such function;
the training loop tabulates it once per run (`lr_table`) so the device reads
the rate of each step it applies (a skipped fp16 step does not advance it).
Reduce-on-plateau is the one schedule that reads data: `Plateau` turns
validation metrics into a multiplier of the (constant) table.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mlptrain.errors import UserError

Schedule = Callable[[int], float]


@dataclass(frozen=True)
class Horizon:
    """What a schedule may depend on besides the step: the run's length and the epoch's."""

    total_steps: int
    steps_per_epoch: int
    warmup_steps: int = 0


def _tabled(lr: Schedule, table: Callable[[int], np.ndarray]) -> Schedule:
    """`lr` with `table(n)`: lr(0), ..., lr(n - 1) as float64, the same bits as calling it n times (the same
    IEEE operations in the same order, elementwise), for `lr_table`. A sweep's trial tabulated its 4,300
    steps in Python, ~4 ms of a packed sweep's start a trial (benchmarks/NOTES.md, issue 30 step 22)."""
    lr.table = table
    return lr


def constant(base_lr: float, horizon: Horizon, config) -> Schedule:
    """lr(t) = base_lr."""
    return _tabled(lambda step: base_lr, lambda n: np.full(n, base_lr, np.float64))


def _progress(steps: np.ndarray, start: int, total: int) -> np.ndarray:
    """_cosine_from's progress of each step: min(max(t - start, 0), total - start) / max(total - start, 1), the
    integers divided as Python divides them (both exact in float64, then one rounding)."""
    return np.minimum(np.maximum(steps - start, 0), total - start) / max(total - start, 1)


CACHED_TERMS_MOST = 2**20  # steps: a longer run's terms (8 bytes a step) are not kept after its table is made


@functools.lru_cache(maxsize=8)
def _cosine_terms(start: int, total: int, n: int) -> np.ndarray:
    """1 + cos(pi progress) of steps 0 .. n - 1 (read-only), by math.cos as the schedule itself computes it
    (NumPy's cos may differ in the last bit); kept for the next run of the same horizon (a sweep's trials share
    theirs), up to CACHED_TERMS_MOST steps (`_cosine_from` calls `__wrapped__` past that)."""
    terms = np.array([1.0 + math.cos(math.pi * p) for p in _progress(np.arange(n), start, total).tolist()])
    terms.flags.writeable = False
    return terms


def _cosine_from(base_lr: float, min_lr: float, start: int, total: int) -> Schedule:
    """min_lr + (base_lr - min_lr) (1 + cos(pi (t - start) / (total - start))) / 2, held at min_lr after total."""
    def lr(step: int) -> float:
        progress = min(max(step - start, 0), total - start) / max(total - start, 1)
        return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def table(n: int) -> np.ndarray:
        terms = _cosine_terms if n <= CACHED_TERMS_MOST else _cosine_terms.__wrapped__
        return min_lr + (base_lr - min_lr) * 0.5 * terms(start, total, n)

    return _tabled(lr, table)


def _with_warmup(base_lr: float, warmup: int, after: Schedule) -> Schedule:
    """lr(t) = base_lr (t + 1) / W for t < W (the first step already moves), then `after`."""
    def table(n: int) -> np.ndarray:
        values = after.table(n)
        ramp = min(warmup, n)
        values[:ramp] = base_lr * np.arange(1, ramp + 1) / warmup
        return values

    return _tabled(lambda step: base_lr * (step + 1) / warmup if step < warmup else after(step), table)


def cosine(base_lr: float, horizon: Horizon, config) -> Schedule:
    """Cosine annealing without restarts (Loshchilov & Hutter, 2017, SGDR) over the run's T steps:
    lr(t) = min_lr + (base_lr - min_lr) (1 + cos(pi t / T)) / 2, which reaches min_lr at t = T, just after
    the last step applied (t = T - 1), as PyTorch's CosineAnnealingLR and optax's cosine_decay_schedule do."""
    return _cosine_from(base_lr, config.min_lr, 0, horizon.total_steps)


def warmup_cosine(base_lr: float, horizon: Horizon, config) -> Schedule:
    """Linear warmup over W steps to base_lr, then cosine over the remaining T - W steps to min_lr."""
    w = horizon.warmup_steps
    return _with_warmup(base_lr, w, _cosine_from(base_lr, config.min_lr, w, horizon.total_steps))


def warmup_linear(base_lr: float, horizon: Horizon, config) -> Schedule:
    """Linear warmup over W steps to base_lr, then linear decay that reaches min_lr at t = T (just after the
    last step applied, t = T - 1)."""
    w, total, min_lr = horizon.warmup_steps, horizon.total_steps, config.min_lr

    def decay(step: int) -> float:
        progress = min(step - w, total - w) / max(total - w, 1)
        return base_lr + (min_lr - base_lr) * progress

    def decays(n: int) -> np.ndarray:
        return base_lr + (min_lr - base_lr) * (np.minimum(np.arange(n) - w, total - w) / max(total - w, 1))

    return _with_warmup(base_lr, w, _tabled(decay, decays))


def step(base_lr: float, horizon: Horizon, config) -> Schedule:
    """lr(t) = base_lr * gamma ^ floor(epoch(t) / step_size), epoch(t) = t // steps_per_epoch."""
    every = config.step_size * horizon.steps_per_epoch
    return lambda t: base_lr * config.gamma ** (t // every)


def inverse_sqrt(base_lr: float, horizon: Horizon, config) -> Schedule:
    """The Transformer's (Vaswani et al., 2017, eq. 3) with s = t + 1, scaled by base_lr:
    lr(t) = base_lr * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)."""
    w, d = horizon.warmup_steps, config.d_model
    return lambda t: base_lr * d ** -0.5 * min((t + 1) ** -0.5, (t + 1) * w ** -1.5)


SCHEDULES = {"constant": constant, "cosine": cosine, "warmup_cosine": warmup_cosine,
             "warmup_linear": warmup_linear, "step": step, "inverse_sqrt": inverse_sqrt,
             "plateau": constant}


def make_schedule(config, base_lr: float, total_steps: int, steps_per_epoch: int) -> Schedule:
    """From the `schedule` config section, `optim.lr`, the run's optimizer steps and those of an epoch."""
    warmup = config.warmup_steps or round(config.warmup_epochs * steps_per_epoch)
    if config.name == "inverse_sqrt":  # a few warmup epochs may round to 0 steps; the formula divides by it
        warmup = max(warmup, 1)
    horizon = Horizon(total_steps, max(steps_per_epoch, 1), warmup)
    return SCHEDULES[config.name](base_lr, horizon, config)


def lr_table(schedule: Schedule, total_steps: int) -> np.ndarray:
    """lr of steps 0 .. total_steps - 1 (float64), what the device reads per applied step: the schedule's own
    table where it has one (`_tabled`), else its value at each step."""
    steps = max(total_steps, 1)
    table = getattr(schedule, "table", None)
    if table is not None:
        return np.ascontiguousarray(table(steps), np.float64)
    return np.array([schedule(t) for t in range(steps)], np.float64)


class Plateau:
    """Reduce-on-plateau as a multiplier, counted as PyTorch's ReduceLROnPlateau counts (strict
    improvement, no threshold): when more than `patience` evaluations in a row have not improved on the
    best metric, multiply by `factor` (floored so that lr >= min_lr) and start counting anew."""

    def __init__(self, config, base_lr: float):
        self.config, self.base_lr = config, base_lr
        self.higher_is_better = config.metric.endswith("acc")
        self.best, self.bad_evaluations, self.multiplier = None, 0, 1.0

    def observe(self, value: float) -> float:
        """Record one evaluation's metric; returns the multiplier to use from now on."""
        better = self.best is None or (value > self.best if self.higher_is_better else value < self.best)
        if better:
            self.best, self.bad_evaluations = value, 0
        else:
            self.bad_evaluations += 1
            if self.bad_evaluations > self.config.patience:
                floor = self.config.min_lr / self.base_lr
                self.multiplier = max(self.multiplier * self.config.factor, floor)
                self.bad_evaluations = 0
        return self.multiplier

    def state_dict(self) -> dict[str, np.ndarray]:
        best = np.nan if self.best is None else self.best
        return {"plateau/best": np.array(best, np.float64), "plateau/bad_evaluations": np.array(self.bad_evaluations),
                "plateau/multiplier": np.array(self.multiplier, np.float64)}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        try:
            best, bad, multiplier = (arrays[f"plateau/{k}"] for k in ("best", "bad_evaluations", "multiplier"))
        except KeyError as err:
            raise UserError(f"checkpoint: the plateau schedule's {err.args[0]} is missing") from None
        self.best = None if math.isnan(float(best)) else float(best)
        self.bad_evaluations, self.multiplier = int(bad), float(multiplier)
