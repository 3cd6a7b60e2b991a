"""SGD, momentum, Adam and AdamW: frozen hyperparameters, flat state, one fused launch per step.

The training loop sums the gradients of a whole accumulation window (the mean
loss's gradient) into the flat gradient buffer first, then runs one
`OptimizerStep`, whose last launch is `Optimizer.update`: one update per
window, never per sample or per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlptrain.errors import UserError


@dataclass(frozen=True)
class SGD:
    """p <- p - lr * (g + wd * p)."""

    weight_decay: float = 0.0
    state_names = ()


@dataclass(frozen=True)
class Momentum:
    """Heavy-ball momentum as PyTorch's SGD(momentum=mu) (Sutskever et al., 2013):

    g' = g + wd * p;  v <- mu * v + g';  p <- p - lr * (g' + mu * v if nesterov else v)
    """

    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    state_names = ("velocity",)


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019):

    g' = g + wd * p (Adam's L2)  or  p <- p * (1 - lr * wd) (AdamW, decoupled)
    m <- b1 m + (1 - b1) g';  v <- b2 v + (1 - b2) g'^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False
    state_names = ("m", "v")


class Optimizer:
    """Hyperparameters and the flat state buffers shaped like the parameters (velocity, or m and v)."""

    def __init__(self, hparams, backend, params):
        self.hparams = hparams
        self.backend = backend
        self.state = {name: backend.zeros((params.layout.size,)) for name in hparams.state_names}

    @property
    def sums_norm(self) -> bool:
        """Whether `update` can also sum the gradient's squares (its `partials`): Adam's and AdamW's."""
        return isinstance(self.hparams, Adam)

    def update(self, params, grads, compute, step_state, partials=None, prepare=None) -> None:
        """One fused update of every parameter from the summed gradient; the learning rate, the gradient
        multiplier (unscale x clip), the bias corrections and whether to apply at all come from the
        device-side step state. `compute` receives the updated weights in the compute format (pass
        `params` itself in fp32). Given `partials` (where `sums_norm`), the update also writes the gradient's
        sum of squares there, as `reduce.sum_of_squares` does; given `prepare` too (lr_schedule, beta1, beta2),
        it takes this step's rules from `prepare_step` on its own copy of the state, which it leaves as it is
        (`step_rules.record_norm` given the same `prepare` writes them after it)."""
        optim = self.backend.kernels.optim
        h = self.hparams
        if partials is not None and not self.sums_norm:
            raise ValueError(f"{type(h).__name__}'s update does not sum the gradient's squares")
        if isinstance(h, SGD):
            optim.sgd_update(params, grads, compute, step_state, h.weight_decay)
        elif isinstance(h, Momentum):
            optim.momentum_update(params, grads, self.state["velocity"], compute, step_state, h.momentum,
                                  h.weight_decay, h.nesterov)
        else:
            optim.adam_update(params, grads, self.state["m"], self.state["v"], compute, step_state, h.betas[0],
                              h.betas[1], h.eps, h.weight_decay, h.decoupled, partials, prepare)

    def lane_hypers(self) -> np.ndarray:
        """This optimizer's row of a packed group's hyperparameters (mlptrain.packing.lane_step): the float32
        values the fused update takes, in the order the `*_update_lanes` kernels read them."""
        h = self.hparams
        if isinstance(h, SGD):
            row = [h.weight_decay]
        elif isinstance(h, Momentum):
            row = [h.momentum, h.weight_decay, h.nesterov]
        else:
            # 1 - beta from the float64 beta, as adam_update takes it
            row = [h.betas[0], h.betas[1], 1.0 - h.betas[0], 1.0 - h.betas[1], h.eps, h.weight_decay,
                   bool(h.decoupled) and bool(h.weight_decay)]
        return np.array(row, np.float64).astype(np.float32)

    @property
    def bias_betas(self) -> tuple[float, float]:
        """The betas of Adam's bias corrections (unused, and 0, for SGD and momentum)."""
        return tuple(self.hparams.betas) if isinstance(self.hparams, Adam) else (0.0, 0.0)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        for name, buf in self.state.items():
            key = f"optim/{name}"
            if key not in arrays or arrays[key].shape != (buf.shape[0],):
                raise UserError(f"checkpoint: optimizer state '{key}' is missing or has the wrong shape")
            self.backend.copy_from_host(buf, arrays[key].astype(np.float32))


def make_optimizer(config, backend, params) -> Optimizer:
    """From the `optim` config section."""
    if config.name == "sgd":
        hparams = SGD(weight_decay=config.weight_decay)
    elif config.name == "momentum":
        hparams = Momentum(momentum=config.momentum, nesterov=config.nesterov, weight_decay=config.weight_decay)
    else:
        hparams = Adam(betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay,
                       decoupled=config.name == "adamw")
    return Optimizer(hparams, backend, params)
