"""`--workers K` placement without a GPU: which CUDA_VISIBLE_DEVICES each worker process gets, what the
parent reports of workers that fail, and that stopping leaves no worker running.

The workers here are tiny Python processes standing in for `mlptrain sweep ... --workers 1`: placement
is decided by the parent alone, so what each child sees in its environment is what a sweep's worker
would see on a machine with those GPUs.
"""

import signal
import subprocess
import sys
import time

import numba.cuda
import pytest

from mlptrain.sweep import workers
from mlptrain.sweep.claims import process_alive

PRINT_GPU = [sys.executable, "-c", "import os; print('gpu=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"]


@pytest.fixture
def gpus(monkeypatch):
    """A machine whose driver shows `n` GPUs (CUDA_VISIBLE_DEVICES unset unless a test sets it)."""
    def machine(n: int, usable: bool = True):
        monkeypatch.setattr(workers, "cuda_usable", lambda: usable)
        monkeypatch.setattr(numba.cuda, "gpus", [object()] * n, raising=False)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return machine


def test_one_gpu_each_when_there_are_several(gpus):
    gpus(4)
    assert workers.gpu_slots("cuda") == ["0", "1", "2", "3"]
    assert workers.gpu_slots("auto") == ["0", "1", "2", "3"]


@pytest.mark.parametrize("n", [0, 1])
def test_a_single_gpu_is_shared_unpinned(gpus, n):
    gpus(n)
    assert workers.gpu_slots("cuda") == [None]


def test_the_cpu_backend_and_an_unusable_gpu_pin_nothing(gpus):
    gpus(8)
    assert workers.gpu_slots("cpu") == [None]
    gpus(8, usable=False)
    assert workers.gpu_slots("auto") == [None]


@pytest.mark.parametrize("visible, slots", [("2,5", ["2", "5"]), (" 3 , 1 ,", ["3", "1"]), ("7", [None]), ("", [None]),
                                            ("GPU-a1b2,GPU-c3d4", ["GPU-a1b2", "GPU-c3d4"])])
def test_cuda_visible_devices_is_divided_not_overridden(gpus, monkeypatch, visible, slots):
    gpus(8)  # the driver's count must not matter: the user already chose the GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert workers.gpu_slots("cuda") == slots


def _run(tmp_path, monkeypatch, command, count, backend="cuda"):
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    monkeypatch.setattr(workers, "POLL_S", 0.05)
    return workers.run_workers(command, count, backend, tmp_path, study=None, sweep=None)


def _seen(tmp_path, count):
    return [(tmp_path / f"worker-{i}.log").read_text().strip() for i in range(count)]


def test_workers_take_the_gpus_in_turn(gpus, tmp_path, monkeypatch, capsys):
    gpus(2)
    assert _run(tmp_path, monkeypatch, PRINT_GPU, 5) == []
    assert _seen(tmp_path, 5) == ["gpu=0", "gpu=1", "gpu=0", "gpu=1", "gpu=0"]
    assert "5 workers started, GPUs 0, 1;" in " ".join(capsys.readouterr().err.split())


def test_workers_on_one_gpu_or_the_cpu_inherit_the_environment(gpus, tmp_path, monkeypatch):
    gpus(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert _run(tmp_path, monkeypatch, PRINT_GPU, 2) == []
    assert _seen(tmp_path, 2) == ["gpu=3", "gpu=3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    (tmp_path / "cpu").mkdir()
    assert _run(tmp_path / "cpu", monkeypatch, PRINT_GPU, 2, backend="cpu") == []
    assert _seen(tmp_path / "cpu", 2) == ["gpu=unset", "gpu=unset"]


def test_a_failing_worker_is_reported_with_its_log(gpus, tmp_path, monkeypatch):
    gpus(0)
    command = [sys.executable, "-c", "import sys, os; sys.exit(3)"]
    failed = _run(tmp_path, monkeypatch, command, 2, backend="cpu")
    assert failed == [f"worker {i} exited with code 3 (see {tmp_path}/worker-{i}.log)" for i in range(2)]


def test_stopping_signals_every_worker_and_kills_one_that_ignores_it(monkeypatch):
    monkeypatch.setattr(workers, "STOP_WAIT_S", 1.0)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"  # its handler is in place before the signal
    started = time.monotonic()
    workers.stop_workers([polite, stubborn], signal.SIGTERM)
    assert time.monotonic() - started < 10
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL


def test_a_worker_dies_with_its_parent(tmp_path):
    """The parent killed by SIGKILL (no handler runs) still takes its workers along: PR_SET_PDEATHSIG."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from mlptrain.sweep import workers\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "preexec_fn=workers.die_with_parent)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n")])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while process_alive(child, None) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(child, None)

