"""One optimizer step per accumulation window, decided on the device.

Three launches: the gradient's sum of squares, `finish_step` (loss scaling,
skipping, clipping, the schedule's lr, bias corrections: see
`mlptrain.optim.step_state.finish_step`) and the optimizer's fused update. Their
scalars travel through the step state on the device, so the loop never
waits for the host; the host reads the state where it synchronises anyway.
Where the update never reads the norm (`step_state.norm_later`) and can sum the
gradient's squares itself (Adam's), they are two: the update, taking the step's
rules from `prepare_step` on its own copy of the state, and `record_norm`,
which also writes those rules: the same state and record, one pass over the
gradient and one launch fewer.
A training window's data cursor moves on in the rules' launch (`advance`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlptrain.errors import UserError
from mlptrain.optim import step_state as slots
from mlptrain.optim.optimizers import Optimizer


@dataclass(frozen=True)
class LossScaling:
    """Dynamic loss scaling (fp16): PyTorch GradScaler's rule and defaults."""

    init: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


class OptimizerStep:
    """The step state, the per-run lr table and grad-norm record, and the launches of one step."""

    def __init__(self, optimizer: Optimizer, backend, lr_table: np.ndarray, total_windows: int,
                 clip_grad_norm: float | None = None, loss_scaling: LossScaling | None = None):
        self.optimizer, self.backend = optimizer, backend
        self.clip_grad_norm = clip_grad_norm or 0.0
        self.loss_scaling = loss_scaling
        initial = np.zeros(slots.SIZE, np.float64)
        initial[slots.LOSS_SCALE] = loss_scaling.init if loss_scaling else 1.0
        initial[slots.LR_FACTOR] = 1.0
        self.state = backend.to_device(initial)
        self.loss_scale = self.state[slots.LOSS_SCALE:slots.LOSS_SCALE + 1]
        self.partials = backend.zeros((backend.kernels.reduce.PARTIALS,))
        self.lr_table = backend.to_device(np.asarray(lr_table, np.float64))
        self.grad_norms = backend.zeros((max(total_windows, 1),), np.float64)
        # the norm summed by the update and recorded after it (fixed for the run: a graph captures the launches)
        self.norm_later = optimizer.sums_norm and slots.norm_later(self.clip_grad_norm, loss_scaling is not None)

    def __call__(self, params, grads, compute, cursor=None, advance: int = 0) -> None:
        """Update `params` (and their `compute` copy) from the window's summed gradient `grads`; then
        cursor[0] += advance (a window's data cursor, moved by the rules' kernel rather than a launch of its
        own: one kernel boundary fewer a step)."""
        k = self.backend.kernels
        beta1, beta2 = self.optimizer.bias_betas
        if self.norm_later:
            prepare = (self.lr_table, beta1, beta2)
            self.optimizer.update(params, grads, compute, self.state, self.partials, prepare)
            k.step_rules.record_norm(self.partials, self.state, self.grad_norms, cursor, advance, prepare)
            return
        scaling = self.loss_scaling or LossScaling()
        k.reduce.sum_of_squares(grads, self.partials)
        # the update reads no cursor: the rules before it may move it
        k.step_rules.finish_step(self.partials, self.state, self.lr_table, self.grad_norms, self.clip_grad_norm,
                                 beta1, beta2, self.loss_scaling is not None, scaling.growth_factor,
                                 scaling.backoff_factor, scaling.growth_interval, cursor, advance)
        self.optimizer.update(params, grads, compute, self.state)

    def lane_hypers(self) -> np.ndarray:
        """This step's row of a packed group's `finish_step` hyperparameters (step_state.LANE_HYPERS), the values
        `__call__` passes."""
        scaling = self.loss_scaling or LossScaling()
        beta1, beta2 = self.optimizer.bias_betas
        return np.array([self.clip_grad_norm, beta1, beta2, self.loss_scaling is not None, scaling.growth_factor,
                         scaling.backoff_factor, scaling.growth_interval], np.float64)

    def read(self) -> dict:
        """The step state on the host (a synchronisation): steps, windows, skipped, loss_scale, lr, grad_norm."""
        return _decode(self.backend.to_host(self.state))

    @staticmethod
    def decoded(state: np.ndarray) -> dict:
        """`read` of a host copy of the step state (`state`, as Backend.to_host_later copied it)."""
        return _decode(state)

    def grad_norm_history(self, start: int, stop: int) -> np.ndarray:
        """Pre-clip norms of windows [start, stop), skipped ones (non-finite under loss scaling) left out."""
        norms = self.backend.to_host(self.grad_norms[start:stop])
        return norms[np.isfinite(norms)] if self.loss_scaling else norms

    def set_lr_factor(self, factor: float) -> None:
        self.backend.copy_from_host(self.state[slots.LR_FACTOR:slots.LR_FACTOR + 1], np.array([factor], np.float64))

    def state_dict(self) -> dict[str, np.ndarray]:
        return {key: self.backend.to_host(array) for key, array in self.device_state().items()}

    def device_state(self) -> dict:
        """The device arrays `state_dict` copies, by their checkpoint keys."""
        return {"step/state": self.state, "step/grad_norms": self.grad_norms,
                **{f"optim/{name}": buf for name, buf in self.optimizer.state.items()}}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Step count, loss scale, growth tracker, skipped count, lr factor, grad-norm record, optimizer
        state. The record may be shorter than this run's (a resumed run whose train.epochs grew)."""
        state, norms = arrays.get("step/state"), arrays.get("step/grad_norms")
        if state is None or state.shape != tuple(self.state.shape):
            raise UserError("checkpoint: 'step/state' is missing or has the wrong shape")
        if norms is None or norms.ndim != 1 or len(norms) > self.grad_norms.shape[0]:
            raise UserError("checkpoint: 'step/grad_norms' is missing or longer than this run's")
        problem = _state_problem(state)
        if problem:
            raise UserError(f"checkpoint: 'step/state' {problem}")
        self.backend.copy_from_host(self.state, state.astype(np.float64))
        self.backend.copy_from_host(self.grad_norms[:len(norms)], norms.astype(np.float64))
        self.optimizer.load_state_dict(arrays)


def _decode(state: np.ndarray) -> dict:
    """The step state's slots by name."""
    return {"steps": int(state[slots.STEP]), "windows": int(state[slots.WINDOWS]),
            "skipped": int(state[slots.SKIPPED]), "loss_scale": float(state[slots.LOSS_SCALE]),
            "lr": float(state[slots.LR]), "grad_norm": float(state[slots.GRAD_NORM])}


def _state_problem(state: np.ndarray) -> str | None:
    """Why a saved step state cannot be continued from (None when it can)."""
    if not np.isfinite(np.delete(state, slots.GRAD_NORM)).all():  # a skipped fp16 window's norm is inf/NaN
        return "holds NaN or infinite values"
    counters = state[[slots.STEP, slots.WINDOWS, slots.SKIPPED, slots.GOOD_STEPS]]
    if (counters < 0).any() or (counters != np.floor(counters)).any() or (counters > 2**53).any():
        return "has a step count that is not a whole number in [0, 2**53]"
    if state[slots.LOSS_SCALE] <= 0 or state[slots.LR_FACTOR] <= 0:
        return "has a loss scale or lr factor <= 0"
    return None
