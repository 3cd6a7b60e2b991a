"""The driver's cubin index read back: a good entry loads, one the driver refuses is dropped (numba then makes
the kernel again), garbage never reaches the driver. The driver is stood in for: no GPU needed."""

import pytest

from mlptrain.backends.driver import api
from mlptrain.backends.kernel_cache import cache, cubins, kernels
from mlptrain.backends.kernel_cache.store import KernelStore

KEY = "ab" * 32


@pytest.fixture
def store(tmp_path):
    yield cache.use_store(tmp_path)
    cache.use_store(None)


def test_an_entry_loads_through_the_driver(store, monkeypatch):
    loaded = []
    monkeypatch.setattr(api, "load_function", lambda image, name: loaded.append((image, name)) or "function")
    store.put(KEY, cubins.payload("_Z6kernel", b"cubin bytes"))
    before = cache.STATS.from_index
    assert kernels.Kernel._from_index(KEY) == "function"
    assert loaded == [(b"cubin bytes", "_Z6kernel")] and cache.STATS.from_index == before + 1


def test_an_entry_the_driver_refuses_is_dropped(store, monkeypatch, capsys):
    def refuse(image, name):
        raise api.DriverError("cuModuleLoadData", "CUDA_ERROR_INVALID_IMAGE")

    monkeypatch.setattr(api, "load_function", refuse)
    store.put(KEY, cubins.payload("_Z6kernel", b"not a cubin"))
    assert kernels.Kernel._from_index(KEY) is None
    assert not store.contains(KEY) and "does not load (CUDA_ERROR_INVALID_IMAGE)" in capsys.readouterr().err


def test_garbage_never_reaches_the_driver(store, monkeypatch):
    monkeypatch.setattr(api, "load_function", lambda image, name: pytest.fail("the driver got garbage"))
    store.put(KEY, b"no entry name here")
    assert kernels.Kernel._from_index(KEY) is None
    assert kernels.Kernel._from_index("cd" * 32) is None  # absent
    assert KernelStore(store.root).contains(KEY)  # a payload of the wrong shape is a miss, not corrupt
