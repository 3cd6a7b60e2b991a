"""Learning-rate schedules: pure functions of the optimizer step (0-based), registered by name."""

from __future__ import annotations

from typing import Callable

Schedule = Callable[[int], float]


def constant(base_lr: float) -> Schedule:
    """lr(t) = base_lr."""
    return lambda step: base_lr


SCHEDULES = {"constant": constant}


def make_schedule(config, base_lr: float) -> Schedule:
    """From the `schedule` config section and `optim.lr`."""
    return SCHEDULES[config.name](base_lr)
