"""Optimizers over the flat parameter buffer, and learning-rate schedules."""

from mlptrain.optim.optimizers import Optimizer, make_optimizer
from mlptrain.optim.schedules import SCHEDULES, make_schedule

__all__ = ["Optimizer", "make_optimizer", "SCHEDULES", "make_schedule"]
