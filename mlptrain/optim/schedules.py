"""Learning-rate schedules: pure functions of the 0-based optimizer step, registered by name.

`make_schedule` turns the `schedule` config section into one such function;
the training loop calls it once per optimizer step.
"""

from __future__ import annotations

import math
from typing import Callable

Schedule = Callable[[int], float]


def constant(base_lr: float, total_steps: int, min_lr: float = 0.0) -> Schedule:
    """lr(t) = base_lr."""
    return lambda step: base_lr


def cosine(base_lr: float, total_steps: int, min_lr: float = 0.0) -> Schedule:
    """Cosine annealing without restarts (Loshchilov & Hutter, 2017, SGDR):
    lr(t) = min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2, held at min_lr after T steps."""
    def lr(step: int) -> float:
        progress = min(step, total_steps) / max(total_steps, 1)
        return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return lr


SCHEDULES = {"constant": constant, "cosine": cosine}


def make_schedule(config, base_lr: float, total_steps: int) -> Schedule:
    """From the `schedule` config section, `optim.lr` and the run's number of optimizer steps."""
    return SCHEDULES[config.name](base_lr, total_steps, config.min_lr)
