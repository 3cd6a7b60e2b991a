"""Test set-up: CUDA kernels run on the real GPU when one answers, else on
Numba's CUDA simulator (CI). This must run before anything imports numba."""

import ctypes
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest


def _real_gpu_present() -> bool:
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return libcuda.cuInit(0) == 0 and libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _real_gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

# decoded datasets go to a cache of this session's own, not the developer's ~/.cache (removed at the end)
_DATA_CACHE = None if "MLPTRAIN_DATA_CACHE" in os.environ else tempfile.mkdtemp(prefix="mlptrain-data-cache-")
if _DATA_CACHE:
    os.environ["MLPTRAIN_DATA_CACHE"] = _DATA_CACHE
# and sweeps' empty study files likewise (mlptrain.sweep.engine)
_STUDY_CACHE = None if "MLPTRAIN_STUDY_CACHE" in os.environ else tempfile.mkdtemp(prefix="mlptrain-study-cache-")
if _STUDY_CACHE:
    os.environ["MLPTRAIN_STUDY_CACHE"] = _STUDY_CACHE


def pytest_unconfigure(config):
    for cache in (_DATA_CACHE, _STUDY_CACHE):
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


# The signal tests send SIGINT and SIGHUP to the commands they start, which inherit an ignored signal: a suite
# started under nohup (SIGHUP ignored) or in a non-interactive shell's background (SIGINT ignored) would see
# them ignored. The suite's own process takes them as usual, so its children do too.
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# tiny test grids are meant to be small; the occupancy warning would only add noise
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
ON_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
DATA_DIR = Path(os.environ.get("MLPTRAIN_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "datasets")).resolve()
if "MLPTRAIN_DATA_DIR" in os.environ:
    # CI sets a relative path (../shared/datasets): the tests' subprocesses that start in a temporary folder
    # must find the same data
    os.environ["MLPTRAIN_DATA_DIR"] = str(DATA_DIR)


def pytest_collection_modifyitems(config, items):
    skip_real = pytest.mark.skip(reason="needs a real GPU (the CUDA simulator is too slow or lacks the feature)")
    for item in items:
        if "real_gpu" in item.keywords and ON_SIMULATOR:
            item.add_marker(skip_real)


def under_ci() -> bool:
    """CI sets CI=true (.ci/run exports it): there, missing data is a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def real_data_missing(what: str) -> None:
    """Skip a test whose real data is absent, with the reason pytest's `-ra` summary prints (the README's
    test command shows it); under CI fail instead, so a run without the data cannot pass by skipping."""
    reason = f"{what} not found at {DATA_DIR} (set MLPTRAIN_DATA_DIR to the folder holding mnist/)"
    if under_ci():
        pytest.fail(f"{reason}; CI=true, so the real-data tests must run", pytrace=False)
    pytest.skip(reason)


def pytest_report_header(config):
    found = (DATA_DIR / "mnist").is_dir()
    return f"real datasets: {DATA_DIR} ({'found' if found else 'NOT FOUND: the tests that need them skip'})"


@pytest.fixture
def data_dir():
    if not (DATA_DIR / "mnist").is_dir():
        real_data_missing("real datasets")
    return DATA_DIR


@pytest.fixture
def rng():
    return __import__("numpy").random.default_rng(1234)


# name -> (built-in config, overrides): the smallest runs that still train on the real data, for the
# feature extraction and SVM tests (a few seconds together on the CPU)
TINY_RUNS = {
    "ae": ("autoencoder_cifar10", ["model.channels=[4,4]", "train.batch_size=256"]),
    "mlp": ("adam_mnist", ["model.hidden=[16]", "train.batch_size=256"]),
    "mlp-bf16": ("adam_mnist", ["model.hidden=[16]", "train.batch_size=256", "train.precision=bf16"]),
}


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """Run directories (runs/<name>) of TINY_RUNS trained for one epoch on the CPU backend."""
    if not (DATA_DIR / "mnist").is_dir():
        real_data_missing("real datasets")
    from mlptrain.cli.configs import resolve_config
    from mlptrain.config.load import load_config
    from mlptrain.run_dirs.lock import release_run
    from mlptrain.training.experiment import Resources, create_run
    from mlptrain.training.loop import train
    from mlptrain.training.session import build_session

    runs_dir, resources, out = tmp_path_factory.mktemp("tiny") / "runs", Resources(), {}
    for name, (config_name, overrides) in TINY_RUNS.items():
        overrides = ["backend=cpu", "train.epochs=1", f"data.root={DATA_DIR}", *overrides]
        config = load_config(resolve_config(config_name), overrides)
        session = build_session(config, *resources.prepare(config))
        out[name] = create_run(config, runs_dir, name, config_name, dataset=session.dataset, backend="cpu")
        train(session, out[name])
        release_run(out[name])  # a CLI process holds a run's lock until it exits; the tests' later processes use it
    return out
