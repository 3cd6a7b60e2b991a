"""Fixtures of the sweep tests: a small learnable stand-in for MNIST, and a record of what trained."""

import numpy as np
import pytest

from mlptrain.data import DATASETS, ImageDataset
from mlptrain.sweep import engine


def _banded(rng, n):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, 784)).astype(np.uint8)
    for c in range(10):
        images[labels == c, c * 78:(c + 1) * 78] += 150
    return images, labels


@pytest.fixture
def tiny_mnist(monkeypatch):
    rng = np.random.default_rng(0)
    (train_x, train_y), (test_x, test_y) = _banded(rng, 600), _banded(rng, 200)
    dataset = ImageDataset("mnist", train_x, train_y, test_x, test_y, (1, 28, 28), 10, 0.3, 0.3)
    monkeypatch.setitem(DATASETS, "mnist", lambda *args, **kwargs: dataset)


@pytest.fixture
def trains(monkeypatch):
    """The list of configs a trial's training began with, in order."""
    calls, real = [], engine.training

    def counting(session, *args, **kwargs):
        calls.append(session.config)
        return (yield from real(session, *args, **kwargs))

    monkeypatch.setattr(engine, "training", counting)
    return calls
