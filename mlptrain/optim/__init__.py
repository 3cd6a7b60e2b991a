"""Optimizers over the flat parameter buffer, the device-decided optimizer step, and learning-rate schedules."""

from mlptrain.optim.optimizers import Optimizer, make_optimizer
from mlptrain.optim.schedules import SCHEDULES, Plateau, lr_table, make_schedule
from mlptrain.optim.step import LossScaling, OptimizerStep

__all__ = ["Optimizer", "make_optimizer", "SCHEDULES", "Plateau", "lr_table", "make_schedule", "LossScaling",
           "OptimizerStep"]
