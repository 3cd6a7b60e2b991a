"""Deterministic reductions (NumPy backend)."""

import numpy as np

from mlptrain.dtypes import to_float32

PARTIALS = 256


def bias_backward_workspace(rows, columns):
    """The NumPy twin needs no workspace."""
    return 0


def bias_backward(dy, db, beta, workspace=None):
    """db = beta * db + sum over rows of dy; dy in any storage format, db float32 (workspace unused)."""
    with np.errstate(over="ignore", invalid="ignore"):  # an fp16 inf is the loss scaler's signal, not an error
        total = to_float32(dy).sum(axis=0, dtype=np.float32)
        if beta == 0.0:
            db[...] = total
        else:
            db *= beta
            db += total


def sum_of_squares(x, partials):
    """partials[b] = the sum of x[i]^2 over block b's share of x; sum(partials) = ||x||^2.

    The NumPy twin puts the whole sum (in float64) in partials[0].
    """
    partials[...] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN gradients must show up, not warn
        partials[0] = np.dot(x.astype(np.float64), x.astype(np.float64))


def bias_backward_lanes(dy, db, beta):
    """db[z] = beta * db[z] + sum over rows of dy[z], for every lane z: `bias_backward` lane by lane."""
    for z in range(dy.shape[0]):
        bias_backward(dy[z], db[z], beta)


def sum_of_squares_lanes(x, partials):
    """`sum_of_squares(x[z], partials[z])` for every lane z."""
    for z in range(x.shape[0]):
        sum_of_squares(x[z], partials[z])
