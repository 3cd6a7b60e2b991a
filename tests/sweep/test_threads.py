"""`--workers K` on GPUs: K trials at once as threads of the sweep's process.

Which GPU each worker gets, that a signal or an error in one worker stops all of them (each queueing its
trial again), and a whole threaded sweep run exactly once per trial. Threads run on the CPU backend here
(a view's backend is made on its device only for CUDA); the real GPUs run the same code in the
gpu-marked test at the end and in benchmarks/sweep_gpus.py.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import optuna
import pytest

from mlptrain.sweep import claims, engine, threads
from mlptrain.sweep import study as studies
from mlptrain.sweep.spec import load_sweep
from mlptrain.sweep.gpu_processes import PROCESS_PER_GPU_ENV
from mlptrain.training.experiment import Resources
from tests.cli.test_cli import REPO
from tests.sweep.test_sweep import FAST, study_trials, write_sweep


LEARNED = ("val_acc", "val_loss", "test_acc", "test_loss", "best_val_acc")  # a trial's metrics other than its timings


class Views:
    """Resources stand-in: records the device each worker's view was made for."""

    def __init__(self):
        self.devices = []

    def on_gpu(self, device):
        self.devices.append(device)
        return device


def test_worker_i_gets_gpu_i_mod_the_gpus_and_prepares_before_the_trials_begin():
    seen, views, order = [], Views(), []

    def prepare(device):
        order.append("prepare")

    def work(device, stop):
        order.append("work")
        seen.append((device, threading.current_thread() is threading.main_thread()))

    pool = threads.TrialThreads(5, 2, views, prepare)
    time.sleep(0.2)  # the study is opened here meanwhile
    assert order == ["prepare"] * 5
    pool.run(work)
    assert sorted(views.devices) == [0, 0, 0, 1, 1] and pool.devices == [0, 1]
    assert sorted(seen) == [(0, False)] * 3 + [(1, False)] * 2 and order[5:] == ["work"] * 5


def test_an_error_in_one_worker_stops_the_others_and_is_raised_here():
    stopped, started = [], threading.Barrier(3)

    def work(device, stop):
        started.wait(5)  # every worker has taken a trial
        if threading.current_thread().name == "sweep-worker-2":
            raise RuntimeError("the storage went away")
        deadline = time.monotonic() + 10
        while not stop.signum and time.monotonic() < deadline:  # a trial, reading stop after each step
            time.sleep(0.01)
        stopped.append(stop.signum)

    with pytest.raises(RuntimeError, match="storage went away"):
        threads.TrialThreads(3, 1, Views(), lambda view: None).run(work)
    assert stopped == [signal.SIGTERM, signal.SIGTERM]


def test_a_failed_preparation_stops_the_sweep_before_any_trial():
    def prepare(device):
        if device == 1:
            raise RuntimeError("no context on GPU 1")

    worked = []
    with pytest.raises(RuntimeError, match="no context"):
        threads.TrialThreads(4, 2, Views(), prepare).run(lambda device, stop: worked.append(device))
    assert worked == []  # the workers that prepared wait for the study, then see the stop


def test_ctrl_c_stops_every_worker_after_its_step_then_is_raised(monkeypatch):
    stopped, started = [], threading.Barrier(3)

    def work(device, stop):
        started.wait(5)
        while not stop.signum:
            time.sleep(0.01)
        stopped.append(stop.signum)

    pool = threads.TrialThreads(2, 2, Views(), lambda view: None)
    real_join = threading.Thread.join

    def interrupted(thread, timeout=None):  # Ctrl-C reaches the main thread while it waits
        if timeout is not None:
            started.wait(5)
            raise KeyboardInterrupt
        return real_join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.run(work)
    assert stopped == [signal.SIGINT, signal.SIGINT]  # both finished before the interrupt left run()


def test_cancel_before_the_trials_ends_every_thread():
    pool = threads.TrialThreads(3, 2, Views(), lambda view: time.sleep(0.1))
    pool.cancel()
    assert not any(t.is_alive() for t in pool.threads) and pool.stop.signum == signal.SIGTERM


def test_threads_only_on_a_real_gpu(monkeypatch):
    monkeypatch.setattr(threads, "driver_gpu_count", lambda: 2)
    assert threads.thread_gpus("cuda") == 2 and threads.thread_gpus("auto") == 2
    assert threads.thread_gpus("cpu") == 0  # NumPy's trials run as processes
    monkeypatch.setattr(threads, "driver_gpu_count", lambda: None)  # the simulator: only numba can tell
    assert threads.thread_gpus("cuda") == 0
    monkeypatch.setattr(threads, "driver_gpu_count", lambda: "the CUDA driver sees no GPU")
    assert threads.thread_gpus("auto") == 0


@pytest.mark.parametrize("workers, pack", [(3, 1), (2, 3)])  # (2, 3): each thread trains 3 at once (--pack)
def test_a_threaded_sweep_runs_every_trial_exactly_once(tmp_path, tiny_mnist, trains, monkeypatch, workers, pack):
    monkeypatch.setattr(threads, "thread_gpus", lambda backend: 2)  # as on a machine with two GPUs
    from mlptrain.cli.sweep import sweep

    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002, 0.003, 0.004, 0.005], "seed": [0, 1]})
    sweep(str(path), FAST, tmp_path / "runs", "s", None, workers, False, pack)
    results = json.loads((tmp_path / "runs" / "s" / "results.json").read_text())
    assert [t["state"] for t in results["trials"]] == ["complete"] * 10
    assert len(trains) == 10
    assert sorted((c.optim.lr, c.seed) for c in trains) == sorted(
        (lr, seed) for lr in (0.001, 0.002, 0.003, 0.004, 0.005) for seed in (0, 1))
    trials = study_trials(tmp_path / "runs" / "s")
    assert len({t.system_attrs[claims.WORKER]["pid"] for t in trials}) == 1  # one process ran them all


def test_a_stopped_trial_is_queued_again_and_no_other_is_taken(tmp_path, tiny_mnist, monkeypatch):
    path = write_sweep(tmp_path, {"seed": [0, 1, 2]})
    spec = load_sweep(path, FAST)
    sweep_dir = tmp_path / "s"
    sweep_dir.mkdir()
    study, storage = studies.open_study(spec, sweep_dir, "s", f"sqlite:///{sweep_dir / 'study.db'}")
    stop, real = threads.Stop(), engine.training

    def stopped_by_another_thread(session, *args, **kwargs):
        stop.signum = signal.SIGINT  # as Ctrl-C in the sweep's main thread does
        return (yield from real(session, *args, **kwargs))

    monkeypatch.setattr(engine, "training", stopped_by_another_thread)
    engine.work(study, storage, spec, sweep_dir, Resources(), wait_for_others=False, stop=stop, progress=False)
    states = [(t.state, t.user_attrs.get("retry_of")) for t in study.get_trials()]
    assert states == [(optuna.trial.TrialState.FAIL, None), (optuna.trial.TrialState.WAITING, None),
                      (optuna.trial.TrialState.WAITING, None), (optuna.trial.TrialState.WAITING, 0)]


@pytest.mark.real_gpu
def test_trials_trained_at_once_on_the_gpu_match_trials_trained_one_at_a_time(tmp_path, data_dir):
    """Three workers share the machine's GPUs (several on one, each on its own stream): every trial's
    metrics are bit for bit those of the same trial in a one-worker sweep, and the command exits cleanly
    (numba once crashed the process at exit after threads had used two GPUs)."""
    path = write_sweep(tmp_path, {"seed": [0, 1, 2, 3, 4]})
    overrides = ["backend=cuda", "train.epochs=2", "model.hidden=[64]", "data.val_size=1000", "train.batch_size=256"]
    metrics = {}
    for workers, per_gpu in ((1, "0"), (3, "0"), (3, "1")):  # threads; a process per GPU where there are several
        name = f"w{workers}-{per_gpu}"
        done = subprocess.run([sys.executable, "-m", "mlptrain", "sweep", str(path), *overrides, "--runs-dir",
                               str(tmp_path / "runs"), "--name", name, "--workers", str(workers)], cwd=REPO,
                              env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir), PROCESS_PER_GPU_ENV: per_gpu},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        results = json.loads((tmp_path / "runs" / name / "results.json").read_text())
        assert [t["state"] for t in results["trials"]] == ["complete"] * 5
        metrics[name] = {t["params"]["seed"]: {k: v for k, v in t["metrics"].items() if k in LEARNED}
                         for t in results["trials"]}
    assert metrics["w3-0"] == metrics["w1-0"] == metrics["w3-1"]
    assert all(len(m) == len(LEARNED) for m in metrics["w1-0"].values())
