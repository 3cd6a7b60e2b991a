"""The resident splits: a dataset's own validation split, and float32 features gathered like pixels."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.data.dataset import ImageDataset
from mlptrain.data.loader import (ORDERS_KEPT, ResidentSplit, check_val_size, epoch_order, held_out_index,
                                  resident_splits)
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


def held_out_dataset(rng, train=200):
    images, labels = rng.integers(0, 256, (train, 4), dtype=np.uint8), rng.integers(0, 3, train, dtype=np.uint8)
    return ImageDataset("small", images, labels, images[:5], labels[:5], (4,), 3, 0.5, 0.25)


@pytest.mark.parametrize("val_size, held", [(0.1, 20), (0.25, 50), (0.0049, 1), (30, 30), (0, 0)])
def test_val_size_is_a_count_or_a_fraction_of_the_training_images(rng, val_size, held):
    from mlptrain.data.dataset import dataset_record

    ds = held_out_dataset(rng)
    train, val, _ = resident_splits(ds, CpuBackend(), val_size, seed=0)
    assert (train.size, val.size) == (200 - held, held)
    assert (dataset_record(ds, val_size)["train"], dataset_record(ds, val_size)["val"]) == (200 - held, held)


def test_a_val_size_leaving_no_training_image_is_refused_and_over_half_is_warned(rng):
    from mlptrain.data.loader import val_size_note
    from mlptrain.errors import UserError

    ds = held_out_dataset(rng)
    with pytest.raises(UserError, match=r"data.val_size: 0.999 \(200 images\) leaves no training images; small has 200"):
        check_val_size(ds, 0.999)
    assert val_size_note(ds, 0.5) is None and val_size_note(ds, 100) is None
    assert val_size_note(ds, 150) == ("data.val_size 150 holds out 150 of small's 200 training images, training on 50; "
                                      "set a smaller count or a fraction (data.val_size=0.1)")
    assert val_size_note(features_dataset(rng), 10_000) is None  # its own split: nothing held out


@pytest.mark.parametrize("value, read", [("0.2", 0.2), ("5000", 5000), ("5e3", 5000), ("0", 0), ("2.0", 2)])
def test_val_size_reads_a_whole_number_as_a_count(value, read):
    from mlptrain.config.load import config_from_dict, parse_override

    config = config_from_dict({"data": {"val_size": parse_override(f"v={value}")[1]}})
    assert config.data.val_size == read and type(config.data.val_size) is type(read)


@pytest.mark.parametrize("value", [-1, 1.5, -0.2, True, "many"])
def test_a_val_size_neither_count_nor_fraction_is_one_line(value):
    from mlptrain.config.load import config_from_dict
    from mlptrain.errors import UserError

    with pytest.raises(UserError, match="data.val_size"):
        config_from_dict({"data": {"val_size": value}})


def test_a_seeds_held_out_split_is_made_once_and_never_changed(rng):
    """The held-out permutation and sorts are kept per (rows, val_size, seed) (a session is built three times
    over, and a sweep's trials share a few seeds): the same rows as drawn afresh, the same arrays for the next
    session of that seed, read-only (every session of the seed reads them), and another seed's rows differ."""
    ds = held_out_dataset(rng)
    first, _, _ = resident_splits(ds, CpuBackend(), 30, seed=7)
    again, _, _ = resident_splits(ds, CpuBackend(), 30, seed=7)
    other, _, _ = resident_splits(ds, CpuBackend(), 30, seed=8)
    held_out = np.random.default_rng([7, 0x5EED]).permutation(200)
    np.testing.assert_array_equal(first.index, np.sort(held_out[30:]))
    assert again.index is first.index and not first.index.flags.writeable
    assert not np.array_equal(other.index, first.index)
    val, train = held_out_index(200, 30, 7)
    assert train is first.index and val.size == 30 and not val.flags.writeable
    with pytest.raises(ValueError):
        first.index[0] = 0


def test_a_seeds_runs_share_each_epochs_order(rng):
    """A packed sweep's lanes start each epoch together: runs of one seed get the one order of each epoch, the
    permutation of (seed, epoch) made once, read-only; another seed or epoch gets its own; an index its owner may
    change is permuted each time."""
    ds = held_out_dataset(rng)
    first, _, _ = resident_splits(ds, CpuBackend(), 30, seed=7)
    again, _, _ = resident_splits(ds, CpuBackend(), 30, seed=7)
    order = epoch_order(first, 3, 2)
    np.testing.assert_array_equal(order, np.random.default_rng([3, 2]).permutation(first.index))
    assert epoch_order(again, 3, 2) is order and not order.flags.writeable
    assert epoch_order(first, 3, 3) is not order and epoch_order(first, 4, 2) is not order
    for epoch in range(4, 4 + 2 * ORDERS_KEPT):  # a long run keeps only a few epochs' orders
        epoch_order(first, 3, epoch)
    assert epoch_order(first, 3, 2) is not order
    np.testing.assert_array_equal(epoch_order(first, 3, 2), order)
    mine = ResidentSplit(None, None, np.arange(50, dtype=np.int32), None)
    assert epoch_order(mine, 3, 2) is not epoch_order(mine, 3, 2)
    np.testing.assert_array_equal(epoch_order(mine, 3, 2), np.random.default_rng([3, 2]).permutation(mine.index))
