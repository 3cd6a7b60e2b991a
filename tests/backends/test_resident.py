"""A dataset's arrays are put on the device once per backend: a sweep's trials on one worker share them
(the cpu backend reads the host's own arrays, read-only), and the memory plan does not count them twice."""

import numpy as np
import pytest

from mlptrain.backends.counting import CountingBackend
from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import RESIDENT_ARRAYS, CudaBackend
from mlptrain.data.loader import resident_splits
from tests.training.test_accumulation import synthetic_dataset


def test_the_cpu_backend_reads_the_hosts_own_array_and_nothing_writes_it():
    images = np.arange(12, dtype=np.uint8).reshape(3, 4)
    resident = CpuBackend().resident(images)
    assert np.shares_memory(resident, images) and np.array_equal(resident, images)
    with pytest.raises(ValueError):
        resident[0, 0] = 1
    assert images.flags.writeable  # the dataset's own array is left as it was


@pytest.mark.gpu
def test_a_cuda_backend_uploads_an_array_once_and_keeps_the_latest_few():
    backend = CudaBackend()  # the simulator here, the GPU in the gpu run
    arrays = [np.full(5, i, np.uint8) for i in range(RESIDENT_ARRAYS + 1)]
    first = backend.resident(arrays[0])
    assert backend.resident(arrays[0]) is first and backend.holds(arrays[0])
    assert not backend.holds(arrays[0].copy())  # the same values in another array: another upload
    for array in arrays[1:]:
        backend.resident(array)
    assert not backend.holds(arrays[0]) and all(backend.holds(a) for a in arrays[1:])  # the oldest given up
    assert np.array_equal(backend.to_host(backend.resident(arrays[0])), arrays[0])


@pytest.mark.parametrize("make", [CpuBackend, pytest.param(CudaBackend, marks=pytest.mark.gpu)], ids=["cpu", "cuda"])
def test_a_second_session_shares_the_data_and_the_plan_counts_it_once(make):
    backend, dataset = make(), synthetic_dataset()
    data_bytes = sum(a.nbytes for a in (dataset.train_images, dataset.train_labels, dataset.test_images,
                                        dataset.test_labels))
    counting = CountingBackend(backend)
    resident_splits(dataset, counting, 0.1, seed=0)
    first_plan = counting.bytes
    first = resident_splits(dataset, backend, 0.1, seed=0)
    counting = CountingBackend(backend)
    resident_splits(dataset, counting, 0.1, seed=1)
    second = resident_splits(dataset, backend, 0.1, seed=1)
    same = np.shares_memory if backend.name == "cpu" else (lambda a, b: a is b)  # a view of the host's, or one copy
    assert same(second[0].images, first[0].images) and same(second[2].images, first[2].images)
    # the cpu backend never copies the data; a GPU's copy is counted until it is there, the test split's row
    # index with it (every seed's is one array)
    assert first_plan - counting.bytes == (0 if backend.name == "cpu" else data_bytes + first[2].index.nbytes)
    assert not np.array_equal(first[1].index, second[1].index)  # each seed's own validation rows


@pytest.mark.parametrize("make", [CpuBackend, pytest.param(CudaBackend, marks=pytest.mark.gpu)], ids=["cpu", "cuda"])
def test_the_runs_of_a_seed_share_their_row_indexes_on_the_device_while_the_host_keeps_them(make):
    """A split's row index is put on a GPU once (Backend.resident_index): the sessions of one seed (packed lanes)
    share their train and validation rows and every session the test split's, each kept apart from the few arrays
    `resident` keeps (a sweep of many seeds never pushes its dataset out) and dropped with its host array."""
    backend, dataset = make(), synthetic_dataset()
    same = np.shares_memory if backend.name == "cpu" else (lambda a, b: a is b)
    first, again, other = (resident_splits(dataset, backend, 0.1, seed=seed) for seed in (0, 0, 1))
    for split in range(3):
        assert same(again[split].device_index, first[split].device_index)
        assert not first[split].index.flags.writeable
        np.testing.assert_array_equal(backend.to_host(first[split].device_index), first[split].index)
    assert not same(other[1].device_index, first[1].device_index) and same(other[2].device_index, first[2].device_index)
    assert backend.holds(dataset.train_images)
    for seed in range(RESIDENT_ARRAYS + 2):  # more seeds than `resident` keeps arrays: the data stays
        resident_splits(dataset, backend, 0.1, seed=100 + seed)
    assert backend.holds(dataset.train_images) and backend.holds(first[1].index)
    index = np.arange(7, dtype=np.int32)
    index.flags.writeable = False
    copy = backend.resident_index(index)
    assert backend.resident_index(index) is copy or backend.name == "cpu"
    assert backend.holds(index) and not backend.holds(index.copy()) or backend.name == "cpu"
