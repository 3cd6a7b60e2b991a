"""Nothing degrades silently: each fallback prints one warning line and summary.json records it, beside
what actually ran (backend, device, dataset, CUDA graphs)."""

import numpy as np
import pytest

from mlptrain.backends import selection as backend_module
from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend
from mlptrain.backends.selection import get_backend
from mlptrain.config.load import config_from_dict
from mlptrain.data.dataset import ImageDataset
from mlptrain.training.fallbacks import is_subset
from mlptrain.training.loop import train
from mlptrain.training.session import build_session
from mlptrain.training.summary import fallbacks
from mlptrain.util.console import console
from tests.conftest import ON_SIMULATOR

NO_DRIVER = "Error at driver init: CUDA driver library cannot be found"


def small_mnist(rng, train=200, test=50):
    """Named mnist, so it is measured against MNIST's 60,000 + 10,000 images: a subset."""
    def split(n):
        return rng.integers(0, 256, (n, 784), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)

    (train_x, train_y), (test_x, test_y) = split(train), split(test)
    return ImageDataset("mnist", train_x, train_y, test_x, test_y, (1, 28, 28), 10, 0.13, 0.31)


def config(**sections):
    return config_from_dict({"seed": 1, "data": {"val_size": 50}, "model": {"hidden": [8]},
                             "train": {"epochs": 1, "batch_size": 50, "eval_batch_size": 100}, **sections})


def warnings(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("warning:")]


def test_auto_without_a_usable_gpu_runs_on_the_cpu_and_notes_why(monkeypatch):
    monkeypatch.setattr(backend_module, "cuda_unusable_reason", lambda: NO_DRIVER)
    backend = get_backend("auto")
    assert isinstance(backend, CpuBackend)
    assert backend.fallbacks == [f"backend auto: no usable GPU ({NO_DRIVER}); running on the CPU"]
    assert get_backend("cpu").fallbacks == []


def test_the_summary_records_what_ran_and_warns_once_per_fallback(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(backend_module, "cuda_unusable_reason", lambda: NO_DRIVER)
    session = build_session(config(backend="auto"), get_backend("auto"), small_mnist(rng))
    with console.capture() as printed:
        summary = train(session, tmp_path, records={"startup_s": 0.25})
    expected = [f"backend auto: no usable GPU ({NO_DRIVER}); running on the CPU",
                "data: mnist is a subset (200 of 60,000 training and 50 of 10,000 test images); its metrics are "
                "not comparable with the full dataset's"]
    assert warnings(printed.get()) == [f"warning: {note}" for note in expected]
    assert summary["fallbacks"] == expected
    assert (summary["backend"], summary["device"]) == ("cpu", "cpu (NumPy)")
    dataset = summary["dataset"]
    assert (dataset["name"], dataset["train"], dataset["val"], dataset["test"], dataset["subset"]) == (
        "mnist", 150, 50, 50, True)
    assert summary["cuda_graphs"] is False
    assert summary["cuda_graphs_off"] == "the cpu backend launches no CUDA kernels"
    assert summary["startup_s"] == 0.25  # records from the caller land in the summary as they are


def test_a_run_as_asked_has_no_fallbacks(tmp_path, rng):
    dataset = small_mnist(rng)
    dataset = ImageDataset("own", dataset.train_images, dataset.train_labels, dataset.test_images,
                           dataset.test_labels, (1, 28, 28), 10, 0.13, 0.31)
    with console.capture() as printed:
        summary = train(build_session(config(backend="cpu"), CpuBackend(), dataset), tmp_path)
    assert warnings(printed.get()) == [] and summary["fallbacks"] == []
    assert summary["dataset"]["subset"] is None  # not a dataset whose full size is known
    assert is_subset(small_mnist(rng)) is True


def tiny_session(backend, rng, **train_options):
    """One window of 8 samples of 10 pixels: what a graph would capture, small enough for the simulator."""
    dataset = ImageDataset("tiny", rng.integers(0, 256, (15, 10), dtype=np.uint8),
                           rng.integers(0, 3, 15, dtype=np.uint8), rng.integers(0, 256, (4, 10), dtype=np.uint8),
                           rng.integers(0, 3, 4, dtype=np.uint8), (1, 1, 10), 3, 0.5, 0.25)
    session = build_session(config(data={"val_size": 7}, model={"hidden": [4]},
                                   train={"batch_size": 8, **train_options}), backend, dataset)
    session.window.start_epoch(np.arange(8, dtype=np.int32))
    return session


@pytest.mark.skipif(not ON_SIMULATOR, reason="a real GPU captures graphs")
def test_a_cuda_backend_without_graphs_warns_and_records_why(rng):
    session = tiny_session(CudaBackend(), rng)
    with console.capture() as printed:
        session.window.run(0, 8)  # the one full window: launched, then a graph would be captured
    why = "the CUDA simulator cannot capture graphs"
    assert warnings(printed.get()) == [f"warning: no CUDA graph ({why}); launching kernels one by one"]
    assert session.window.graphs_record() == {"cuda_graphs": False, "cuda_graphs_off": why}
    assert session.window.fallback in fallbacks(session)


def test_graphs_switched_off_are_recorded_but_not_a_fallback(rng):
    session = tiny_session(CpuBackend(), rng, cuda_graphs=False)
    session.window.run(0, 8)
    assert session.window.graphs_record() == {"cuda_graphs": False, "cuda_graphs_off": "train.cuda_graphs is false"}
    assert session.window.fallback is None
