"""The resident splits: a dataset's own validation split, and float32 features gathered like pixels."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.data.dataset import ImageDataset
from mlptrain.data.loader import check_val_size, resident_splits
from tests import kernel_cases as cases


def features_dataset(rng, train=10, val=3, test=4, width=5):
    def split(n):
        return rng.normal(size=(n, width)).astype(np.float32), rng.integers(0, 3, n, dtype=np.uint8)

    (x, y), (xv, yv), (xt, yt) = split(train), split(val), split(test)
    return ImageDataset("own", x, y, xt, yt, (width,), 3, 0.0, 1.0, value_scale=1.0, val_images=xv, val_labels=yv)


def test_own_validation_split_is_used_and_val_size_ignored(rng):
    ds = features_dataset(rng)
    check_val_size(ds, 10_000)  # would leave no training images if it were applied
    train, val, test = resident_splits(ds, CpuBackend(), 10_000, seed=0)
    assert train.index.tolist() == list(range(10)) and val.index.tolist() == [10, 11, 12]
    assert train.images is val.images and train.images.dtype == np.float32
    np.testing.assert_array_equal(train.images[val.index], ds.val_images)
    np.testing.assert_array_equal(val.labels[val.index], ds.val_labels)
    assert test.size == 4


@pytest.mark.parametrize("backend", [
    pytest.param(cases.numpy_backend, id="numpy"),
    pytest.param(cases.numba_backend, id="cuda", marks=pytest.mark.gpu),
])
def test_float32_features_gather_like_pixels(rng, backend):
    images = rng.normal(size=(9, 7)).astype(np.float32)
    labels = rng.integers(0, 4, 9, dtype=np.uint8)
    cases.gather_batch_check(backend(), images, labels, rng.permutation(9).astype(np.int32), 2, 5)
