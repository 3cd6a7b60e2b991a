"""Initial parameters: the weight and bias schemes of `model.init`, from each tensor's fans.

Fans as PyTorch counts them (torch.nn.init._calculate_fan_in_and_fan_out): a dense weight stored
(fan_in, fan_out) = (K, N) has fan_in K and fan_out N; a convolution kernel stored (KS, KS, Cin, Cout)
has fan_in KS * KS * Cin and fan_out KS * KS * Cout.

Weights (every layer, the output layer included):

    pytorch         U(-a, a), a = 1 / sqrt(fan_in): torch.nn.Linear's and Conv2d's default,
                    kaiming_uniform_(a=sqrt(5)), whose bound gain * sqrt(3 / fan_in) with
                    gain = sqrt(2 / (1 + 5)) is 1 / sqrt(fan_in)
    he_uniform      U(-a, a), a = sqrt(6 / fan_in)            He et al. (2015), a ReLU's gain sqrt(2)
    he_normal       N(0, s^2), s = sqrt(2 / fan_in)           He et al. (2015); kaiming_normal_, untruncated
    glorot_uniform  U(-a, a), a = sqrt(6 / (fan_in + fan_out)) Glorot and Bengio (2010)

Biases: `pytorch` U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (torch.nn.Linear's and Conv2d's default), or `zeros`.
The names and the defaults per model are mlptrain.config.schema's (model.init).
"""

from __future__ import annotations

import math
import threading

import numpy as np


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight stored (fan_in, fan_out) or (KS, KS, Cin, Cout)."""
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) == 4:
        receptive = shape[0] * shape[1]
        return receptive * shape[2], receptive * shape[3]
    raise ValueError(f"no fans for a weight of shape {shape}: expected (K, N) or (KS, KS, Cin, Cout)")


def weight_init(rng: np.random.Generator, scheme: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 weight of `shape` drawn from `scheme` (see the module docstring)."""
    fan_in, fan_out = fans(shape)
    if scheme == "he_normal":
        return rng.normal(0.0, math.sqrt(2.0 / fan_in), shape).astype(np.float32)
    bound = {"pytorch": 1.0 / math.sqrt(fan_in), "he_uniform": math.sqrt(6.0 / fan_in),
             "glorot_uniform": math.sqrt(6.0 / (fan_in + fan_out))}[scheme]
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def bias_init(rng: np.random.Generator, scheme: str, size: int, fan_in: int) -> np.ndarray:
    """A float32 bias of `size` values for a layer of `fan_in` inputs."""
    if scheme == "zeros":
        return np.zeros(size, np.float32)
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size).astype(np.float32)


def seeded_layers(seed: int, layers, weights: str, biases: str) -> dict[str, np.ndarray]:
    """`init_layers` with the generator of `seed`, read-only: kept for the next model of the seed, layers and
    schemes (a sweep's trials share a few seeds: a packed sweep's 16 lanes of two seeds drew adam_mnist's 670 K
    parameters 16 times over, ~10 ms each, before the first step; benchmarks/NOTES.md, issue 30 step 16)."""
    key = (seed, tuple(layers), weights, biases)
    with _KEPT_LOCK:
        found = _KEPT.pop(key, None)
        if found is not None:
            _KEPT[key] = found  # the most recent last
            return found
    drawn = init_layers(np.random.default_rng(seed), layers, weights, biases)
    for array in drawn.values():
        array.flags.writeable = False
    if sum(array.size for array in drawn.values()) <= KEPT_MOST:
        with _KEPT_LOCK:
            _KEPT[key] = drawn
            while len(_KEPT) > KEPT:
                del _KEPT[next(iter(_KEPT))]
    return drawn


KEPT, KEPT_MOST = 4, 4 * 2**20  # models' draws kept (a few seeds'), of at most 4 M parameters (16 MB) each
_KEPT: dict[tuple, dict[str, np.ndarray]] = {}
_KEPT_LOCK = threading.Lock()  # a sweep's worker threads build their sessions at once


def init_layers(rng: np.random.Generator, layers, weights: str, biases: str) -> dict[str, np.ndarray]:
    """{name.weight, name.bias} for each (name, weight shape) of `layers`, drawn in order (each weight,
    then its bias), so that a seed gives the same parameters every time."""
    out = {}
    for name, shape in layers:
        out[f"{name}.weight"] = weight_init(rng, weights, shape)
        out[f"{name}.bias"] = bias_init(rng, biases, shape[-1], fans(shape)[0])
    return out
