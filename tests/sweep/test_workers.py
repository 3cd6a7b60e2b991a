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
from types import SimpleNamespace

import pytest

from mlptrain.sweep import workers
from mlptrain.sweep.claims import process_alive
from mlptrain.sweep.gpu_processes import PROCESS_PER_GPU_ENV, gpu_shares, process_per_gpu

PRINT_GPU = [sys.executable, "-c", "import os; print('gpu=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"]


@pytest.fixture
def gpus(monkeypatch):
    """A machine whose driver shows `n` GPUs (CUDA_VISIBLE_DEVICES unset unless a test sets it)."""
    def machine(n: int, usable: bool = True):
        monkeypatch.setattr(workers, "gpu_count", lambda: n if usable else 0)
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
    return workers.run_workers(command, count, workers.gpu_slots(backend), tmp_path, study=None, sweep=None)


def _seen(tmp_path, count):
    return _seen_from(tmp_path, range(count))


def _seen_from(tmp_path, indices):
    return [(tmp_path / f"worker-{i}.log").read_text().strip() for i in indices]


def test_workers_take_the_gpus_in_turn(gpus, tmp_path, monkeypatch, capsys):
    gpus(2)
    assert _run(tmp_path, monkeypatch, PRINT_GPU, 5) == []
    assert _seen(tmp_path, 5) == ["gpu=0", "gpu=1", "gpu=0", "gpu=1", "gpu=0"]
    assert "5 workers started, GPUs 0, 1, 0, 1, 0;" in " ".join(capsys.readouterr().err.split())


def test_workers_on_one_gpu_or_the_cpu_inherit_the_environment(gpus, tmp_path, monkeypatch):
    gpus(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert _run(tmp_path, monkeypatch, PRINT_GPU, 2) == []
    assert _seen(tmp_path, 2) == ["gpu=3", "gpu=3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    (tmp_path / "cpu").mkdir()
    assert _run(tmp_path / "cpu", monkeypatch, PRINT_GPU, 2, backend="cpu") == []
    assert _seen(tmp_path / "cpu", 2) == ["gpu=unset", "gpu=unset"]


def test_this_process_is_worker_0_and_keeps_the_first_gpu(gpus, tmp_path, monkeypatch, capsys):
    """With `here`, the command trains as worker 0 (on the first GPU: the children take the others in
    turn), and its children are started before its own share runs, so their start overlaps it."""
    gpus(2)
    order = []

    def here():
        order.append(sorted(p.name for p in tmp_path.glob("worker-*.log")))
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    assert workers.run_workers(PRINT_GPU, 3, workers.gpu_slots("cuda"), tmp_path, None, None, here=here) == []
    assert order == [["worker-1.log", "worker-2.log"]]  # both children were started before here() ran
    assert not (tmp_path / "worker-0.log").exists()
    assert _seen_from(tmp_path, [1, 2]) == ["gpu=1", "gpu=0"]
    assert "3 workers (this process and 2 more), GPUs 0, 1, 0;" in " ".join(capsys.readouterr().err.split())


PRINT_GPU_AND_WORKERS = [*PRINT_GPU[:2], "import os, sys; print('gpu=' + os.environ.get('CUDA_VISIBLE_DEVICES', "
                         "'unset'), 'workers=' + sys.argv[sys.argv.index('--workers') + 1])", "--workers", "1",
                         "--worker"]


@pytest.mark.parametrize("count, shares", [(2, [1, 1]), (3, [2, 1]), (4, [2, 2]), (5, [3, 2]), (1, [1])])
def test_several_gpus_share_the_workers_in_turn(count, shares):
    assert gpu_shares(count, 2) == shares
    assert gpu_shares(count, 8) == [1] * count  # no more GPUs used than workers


def test_a_process_per_gpu_where_it_forks_or_when_asked_for_and_several_gpus_are_used(monkeypatch):
    monkeypatch.delenv(PROCESS_PER_GPU_ENV, raising=False)
    assert process_per_gpu(4, 2) and process_per_gpu(2, 8)  # forked, by default
    assert not process_per_gpu(4, 2, forking=False)  # threads rather than children started from nothing
    monkeypatch.setenv(PROCESS_PER_GPU_ENV, "1")
    assert process_per_gpu(4, 2) and process_per_gpu(4, 2, forking=False)
    assert not process_per_gpu(1, 2) and not process_per_gpu(4, 1)
    monkeypatch.setenv(PROCESS_PER_GPU_ENV, "0")  # threads
    assert not process_per_gpu(4, 2) and not process_per_gpu(4, 2, forking=False)


def test_on_several_gpus_a_process_per_gpu_runs_its_share_as_threads(gpus, tmp_path, monkeypatch, capsys):
    """Threads of one process share its interpreter: on several GPUs each GPU's share of the workers is a
    process of its own, this one the first GPU's; a child's --workers is its share."""
    gpus(3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    shares = gpu_shares(7, 3)
    assert workers.run_workers(PRINT_GPU_AND_WORKERS, 3, workers.gpu_slots("cuda"), tmp_path, None, None,
                               here=lambda: None, threads=shares) == []
    assert _seen_from(tmp_path, [1, 2]) == ["gpu=6 workers=2", "gpu=7 workers=2"]
    said = " ".join(capsys.readouterr().err.split())
    assert "7 workers in 3 processes, one per GPU (3 on GPU 4, 2 on GPU 6, 2 on GPU 7; this process takes GPU 4)" in said


def test_a_command_that_trains_on_no_gpu_watches_a_process_per_gpu(gpus, tmp_path, monkeypatch, capsys):
    """Children on every GPU (forked ones, on a real machine): each GPU's share is a process of its own, and
    the command reports each trial they finish, and saves the results, as it sees them."""
    gpus(3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    monkeypatch.setattr(workers, "POLL_S", 0.05)
    looks = []

    def rows(study, sweep):  # nothing finished at the first look, one trial at every later one
        looks.append(1)
        return [] if len(looks) == 1 else [{"number": 0, "state": "complete", "value": 0.5, "params": {"seed": 1},
                                            "error": None}]
    monkeypatch.setattr(workers, "trial_rows", rows)
    saved = []
    assert workers.run_workers(PRINT_GPU_AND_WORKERS, 3, workers.gpu_slots("cuda"), tmp_path,
                               SimpleNamespace(get_trials=lambda deepcopy: []), SimpleNamespace(metric="val_acc"),
                               threads=gpu_shares(7, 3), on_report=lambda: saved.append(len(looks))) == []
    assert _seen(tmp_path, 3) == ["gpu=4 workers=3", "gpu=6 workers=2", "gpu=7 workers=2"]
    assert len(saved) == 1  # once: the trial was new only once
    said = " ".join(capsys.readouterr().err.split())
    assert "7 workers in 3 processes, one per GPU (3 on GPU 4, 2 on GPU 6, 2 on GPU 7); their output goes to" in said
    assert said.count("trial 0 complete: val_acc 0.5") == 1


def test_a_refusal_here_stops_the_children(gpus, tmp_path, monkeypatch):
    gpus(0)
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    monkeypatch.setattr(workers, "STOP_WAIT_S", 5.0)
    pids = tmp_path / "pids"
    pids.mkdir()
    sleeper = [sys.executable, "-c", f"import os, time; open(os.path.join({str(pids)!r}, str(os.getpid())), 'w')\n"
               "time.sleep(60)"]

    def here():  # the children run; then this process's own set-up refuses
        deadline = time.monotonic() + 30
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("no data")
    with pytest.raises(RuntimeError, match="no data"):
        workers.run_workers(sleeper, 3, [None], tmp_path, None, None, here=here)
    children = [int(p.name) for p in pids.iterdir()]
    assert len(children) == 2 and not any(process_alive(pid, None) for pid in children)


def test_a_worker_that_died_during_a_trial_is_replaced_once_per_worker(tmp_path, monkeypatch, capsys):
    """A child killed while it held a trial: the trial is queued again (here: the stand-in says there was
    one) and a new child takes the same place; the replacements stop after `restarts`, so a trial that
    kills every worker cannot loop, and those deaths are reported as failures."""
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    monkeypatch.setattr(workers, "_requeue_its_trial", lambda study, storage: True)
    dying = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    starts = []

    def start(i):
        starts.append(i)
        return subprocess.Popen(dying)
    watcher = workers._Watcher({1: start(1)}, start, None, None, "storage", tmp_path, restarts=2)
    watcher.watch()
    assert starts == [1, 1, 1]  # the first child, then its two replacements
    assert watcher.failed == [f"worker 1 was killed by signal 9 (see {tmp_path}/worker-1.log)"]
    assert capsys.readouterr().err.count("takes its place") == 2


def test_a_worker_that_held_no_trial_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    monkeypatch.setattr(workers, "_requeue_its_trial", lambda study, storage: False)
    starts = []

    def start(i):
        starts.append(i)
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    watcher = workers._Watcher({1: start(1), 2: start(2)}, start, None, None, "storage", tmp_path, restarts=5)
    watcher.watch()
    assert starts == [1, 2] and len(watcher.failed) == 2


def test_a_failing_worker_is_reported_with_its_log(gpus, tmp_path, monkeypatch):
    gpus(0)
    command = [sys.executable, "-c", "import sys, os; sys.exit(3)"]
    failed = _run(tmp_path, monkeypatch, command, 2, backend="cpu")
    # in the order they were seen to end, which the scheduler decides
    assert sorted(failed) == [f"worker {i} exited with code 3 (see {tmp_path}/worker-{i}.log)" for i in range(2)]


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



def test_a_failing_watch_stops_the_children_and_is_raised(tmp_path, monkeypatch):
    """The watch runs in a thread beside this process's own trials: an error there (the study's storage,
    say) reaches the command, and the children are stopped, not left running."""
    monkeypatch.setattr(workers, "STOP_WAIT_S", 5.0)
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    calls = []

    def broken(study, sweep, reported, show=True, warned=None):
        calls.append(show)
        if len(calls) > 1:
            raise RuntimeError("the storage went away")
    monkeypatch.setattr(workers, "_report", broken)
    monkeypatch.setattr(workers, "POLL_S", 0.05)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = workers.start_workers(sleeper, 2, [None], tmp_path, first=1)
    with pytest.raises(RuntimeError, match="storage went away"):
        workers.run_workers(sleeper, 2, [None], tmp_path, None, None, here=lambda: None, procs=procs)
    assert all(p.poll() is not None for p in procs.values())


def test_cpu_workers_divide_the_cores_between_their_blas_threads(monkeypatch):
    """NumPy's BLAS starts a thread per core in every worker: K workers would fight over the cores."""
    monkeypatch.setattr(workers, "cores", lambda: 8)
    for name in workers.BLAS_THREADS:
        monkeypatch.delenv(name, raising=False)
    assert workers.blas_share(2) == dict.fromkeys(workers.BLAS_THREADS, "4")
    assert workers.blas_share(3) == dict.fromkeys(workers.BLAS_THREADS, "2")
    assert workers.blas_share(16) == dict.fromkeys(workers.BLAS_THREADS, "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice is kept
    assert workers.blas_share(2)["OMP_NUM_THREADS"] == "3"


def test_each_cpu_worker_starts_with_its_share(gpus, tmp_path, monkeypatch):
    gpus(0)
    monkeypatch.setattr(workers, "cores", lambda: 4)
    for name in workers.BLAS_THREADS:
        monkeypatch.delenv(name, raising=False)
    show = [sys.executable, "-c", "import os; print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['OMP_NUM_THREADS'])"]
    monkeypatch.setattr(workers, "trial_rows", lambda study, sweep: [])
    assert workers.run_workers(show, 2, [None], tmp_path, None, None, env=workers.blas_share(2)) == []
    assert _seen(tmp_path, 2) == ["2 2", "2 2"]
