"""The command's first line (mlptrain.sweep.prefork): which arguments fork a process per GPU before anything is
imported, what such a child does until the command's call and after it, and that children the command does
not use are stopped. Without a GPU: the NVIDIA driver's folder of GPUs is a folder made here.

The forks happen in a fresh interpreter (a subprocess): pytest's own process has NumPy's threads."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mlptrain.sweep.prefork import workers_asked

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("args, workers", [
    (["s.yaml", "--workers", "4"], 4),
    (["s.yaml", "--workers=3", "lr=0.1"], 3),
    (["--workers", "2", "s.yaml", "--workers", "5"], 5),  # the last one given, as Click reads it
    (["s.yaml"], 1),  # Click's default
    (["s.yaml", "--workers"], 1),  # the command refuses it itself
    (["s.yaml", "--workers", "0"], None),
    (["s.yaml", "--workers", "two"], None),  # the command refuses it itself
    (["s.yaml", "--workers", "4", "--worker"], None),  # a started worker forks nothing
    (["s.yaml", "--workers", "4", "--help"], None),
])
def test_the_workers_are_read_from_the_arguments(args, workers):
    assert workers_asked(args) == workers


def _fresh(script: str, tmp_path) -> subprocess.CompletedProcess:
    gpus = tmp_path / "gpus"
    for i in range(3):
        (gpus / f"0000:{i:02x}:00.0").mkdir(parents=True)
    prelude = f"""
        import os, sys, threading, time
        from pathlib import Path
        import mlptrain.sweep.gpu_processes as gpu_processes
        gpu_processes.NVIDIA_GPUS = Path({str(gpus)!r})  # a machine with three GPUs
        from mlptrain.sweep import prefork
    """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(prelude) + textwrap.dedent(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k not in (
                                   "NUMBA_ENABLE_CUDASIM", "MLPTRAIN_SWEEP_PROCESS_PER_GPU",
                                   "CUDA_DEVICE_MAX_CONNECTIONS", "MLPTRAIN_SWEEP_TRAINER_PROCESS")},
                               "PYTHONPATH": REPO, "CUDA_VISIBLE_DEVICES": "2,0,1"})


def test_a_child_forked_first_waits_silently_for_its_call_then_runs_it(tmp_path):
    done = _fresh(f"""
        waiting = prefork.start_early(["mlptrain", "sweep", "s.yaml", "--workers", "5"])
        if waiting is not None:  # a child: nothing it prints before its call is seen
            print("before the call", flush=True)
            call = waiting.call()
            from mlptrain.sweep.forked import open_log, run_child
            run_child(lambda: open_log(Path(call["log"])), lambda: print(
                "worker", waiting.index, os.environ["CUDA_VISIBLE_DEVICES"], os.getsid(0) == os.getpid(),
                call["share"], os.environ["CUDA_DEVICE_MAX_CONNECTIONS"], "numpy" in sys.modules,
                *[os.environ.get(name) for name in gpu_processes.BLAS_THREADS]) or call["share"], waiting.done)
        planned, ended = prefork.take_planned(["2", "0", "1"])
        from mlptrain.sweep.forked import Forked
        children = []
        for i, child in sorted(planned.items()):
            print("sent", child.send({{"log": f"worker-{{i}}.log", "share": i + 1}}))
            children.append(Forked(child.pid, child.done))
        print("codes", *[child.wait(60) for child in children], "here", os.environ["CUDA_VISIBLE_DEVICES"],
              os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), "numpy" in sys.modules, threading.active_count(),
              *[os.environ.get(name) for name in gpu_processes.BLAS_THREADS])
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    # five workers on three GPUs: two, two and one, each process's context with two work queues a worker;
    # the command trains on none: no driver started, no work queues set; every process imports NumPy without
    # BLAS threads (and the BLAS variables it read are removed again)
    assert done.stdout.split("\n")[:4] == ["sent True", "sent True", "sent True",
                                           "codes 1 2 3 here 2,0,1 None True 1 None None None"]
    assert (tmp_path / "worker-0.log").read_text() == "worker 0 2 True 1 4 True None None None\n"
    assert (tmp_path / "worker-1.log").read_text() == "worker 1 0 True 2 4 True None None None\n"
    assert (tmp_path / "worker-2.log").read_text() == "worker 2 1 True 3 2 True None None None\n"


@pytest.mark.parametrize("take", ["none", "other GPUs", "at exit", "one died"])
def test_children_the_command_does_not_use_are_stopped(tmp_path, take):
    """A refused sweep file, a CPU backend (nothing taken), other GPUs than planned, or a command that ends
    first: each child is killed and reaped, and says nothing."""
    done = _fresh(f"""
        waiting = prefork.start_early(["mlptrain", "sweep", "s.yaml", "--workers", "3"])
        if waiting is not None:
            print("a child ran", flush=True)
            os._exit(0 if waiting.call() is None else 5)
        pids = [child.pid for child in prefork.PLANNED.values()]
        print(*pids)
        if {take!r} == "none":
            prefork.drop_planned()
        elif {take!r} == "other GPUs":
            print("taken", *prefork.take_planned(["2", "1", "0"]))
        elif {take!r} == "one died":  # before the sweep began: named, and the other stopped
            import signal
            while "a child ran" not in prefork.early_output(prefork.PLANNED[1].out):
                time.sleep(0.01)
            os.kill(pids[1], signal.SIGKILL)
            time.sleep(0.5)
            print("taken", *prefork.take_planned(["2", "0", "1"]))
        if {take!r} != "at exit":
            print("left", len(prefork.PLANNED))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    pids = [int(pid) for pid in lines[0].split()]
    assert len(pids) == 3 and "a child ran" not in lines[0] and "\na child ran" not in done.stdout
    for pid in pids:  # reaped (not a zombie of the ended command): no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    if take == "other GPUs":
        assert lines[1] == "taken None []"
    if take == "one died":  # what it said before it died, quoted by the command's warning
        assert lines[1] == "taken None [('0', 'a child ran')]"


def test_only_a_multi_gpu_sweep_forks_and_only_gpu_commands_start_the_driver(tmp_path):
    done = _fresh("""
        os.environ["MLPTRAIN_SWEEP_TRAINER_PROCESS"] = "0"  # a single-GPU sweep trains in its own process
        started = []
        prefork.start_driver = lambda: started.append(1)  # counted, not started
        for argv in (["mlptrain", "sweep", "s.yaml"], ["mlptrain", "sweep", "s.yaml", "--workers", "1"],
                     ["mlptrain", "sweep", "s.yaml", "--workers", "4", "--worker"], ["mlptrain", "evaluate", "r"],
                     ["mlptrain"], ["mlptrain", "run", "adam_mnist"]):
            started.clear()
            print(prefork.start_early(argv), len(prefork.PLANNED), len(started))
        os.environ["MLPTRAIN_SWEEP_PROCESS_PER_GPU"] = "0"  # threads asked for: nothing forked
        print(prefork.start_early(["mlptrain", "sweep", "s.yaml", "--workers", "4"]), len(prefork.PLANNED))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:7] == ["None 0 1", "None 0 1", "None 0 1", "None 0 0", "None 0 0", "None 0 1",
                                           "None 0"]


@pytest.mark.parametrize("argv", [["sweep", "s.yaml"], ["sweep", "s.yaml", "--workers", "1", "--pack", "4"]])
def test_a_single_gpu_sweep_forks_its_trainer_which_is_silent_until_its_call(tmp_path, argv):
    """One worker on a GPU: a trainer forked first (its own session, its context sized for one worker), the
    command starting no driver; what the trainer wrote before its call comes out on the command's stderr
    once the call comes, and its output is the command's from then on."""
    done = _fresh(f"""
        started = []
        prefork.start_driver = lambda: started.append(os.getpid())
        waiting = prefork.start_early(["mlptrain", *{argv!r}])
        if waiting is not None:
            print("before the call", flush=True)
            call = waiting.call()
            waiting.to_the_command_streams()
            print("trainer", waiting.trainer, call["x"], os.getsid(0) == os.getpid(),
                  os.environ["CUDA_DEVICE_MAX_CONNECTIONS"], started == [os.getpid()], flush=True)
            os._exit(3)
        print("planned", prefork.trainer_planned(), len(prefork.PLANNED), started, flush=True)
        trainer, words = prefork.take_trainer()
        print("taken", words, prefork.trainer_planned(), trainer.send({{"x": 7}}), flush=True)
        from mlptrain.sweep.forked import Forked
        print("code", Forked(trainer.pid, trainer.done).wait(60))
        print("again", prefork.take_trainer())
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:5] == ["planned True 0 []", "taken None False True", "trainer True 7 True 2 True",
                                           "code 3", "again (None, None)"]
    assert done.stderr == "before the call\n"


def test_a_trainer_the_command_does_not_take_is_stopped(tmp_path):
    """A sweep that trains in the command after all (a CPU backend, say) stops its trainer, which said nothing;
    one that died before its call is named with its last words."""
    done = _fresh("""
        waiting = prefork.start_early(["mlptrain", "sweep", "s.yaml"])
        if waiting is not None:
            print("a trainer ran", flush=True)
            time.sleep(60)
            os._exit(0)
        pid = prefork.TRAINER[0].pid
        prefork.drop_planned()
        print("dropped", prefork.trainer_planned(), flush=True)
        try:
            os.kill(pid, 0)
            print("alive")
        except ProcessLookupError:
            print("gone")
        waiting = prefork.start_early(["mlptrain", "sweep", "s.yaml"])
        if waiting is not None:
            print("a trainer ran", flush=True)
            os._exit(0)
        while "a trainer ran" not in prefork.early_output(prefork.TRAINER[0].out):
            time.sleep(0.01)
        time.sleep(0.5)
        print("taken", prefork.take_trainer())
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["dropped False", "gone", "taken (None, 'a trainer ran')"]
    assert "a trainer ran" not in done.stderr


def test_a_refused_sweep_says_so_once_and_leaves_no_child(tmp_path):
    """The command's own entry: its children forked first, then the sweep file refused: one line, exit code
    2, and the children stopped at its exit."""
    done = _fresh("""
        from mlptrain import __main__ as entry
        first = prefork.start_early

        def start_early(argv):  # the command's, its children's pids shown
            waiting = first(argv)
            if waiting is None:
                print(*[child.pid for child in prefork.PLANNED.values()], flush=True)
            return waiting

        prefork.start_early = start_early
        sys.argv = ["mlptrain", "sweep", "missing.yaml", "--workers", "3"]
        entry.main()
    """, tmp_path)
    assert done.returncode == 2, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 3
    assert done.stderr.count("error:") == 1 and "missing.yaml" in done.stderr
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_sweeps_gpu_contexts_get_two_work_queues_a_worker(tmp_path):
    """CUDA_DEVICE_MAX_CONNECTIONS, read as a context is made: two for each worker its GPU runs at most; what
    the user set is kept; other commands leave it alone."""
    done = _fresh("""
        prefork.start_driver = lambda: None
        os.environ["MLPTRAIN_SWEEP_PROCESS_PER_GPU"] = "0"  # threads: nothing forked, every GPU in this process
        os.environ["MLPTRAIN_SWEEP_TRAINER_PROCESS"] = "0"
        for argv in (["mlptrain", "sweep", "s.yaml"], ["mlptrain", "sweep", "s.yaml", "--workers", "5"],
                     ["mlptrain", "sweep", "s.yaml", "--workers", "2", "--worker"], ["mlptrain", "run", "adam_mnist"]):
            os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
            prefork.start_early(argv)
            print(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"))
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
        prefork.start_early(["mlptrain", "sweep", "s.yaml"])
        print(os.environ["CUDA_DEVICE_MAX_CONNECTIONS"])
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "4", "None", "None", "8"]


def test_what_a_child_says_before_its_call_starts_its_log(tmp_path):
    """The child's output before its call (its imports' warnings) is kept in memory and starts its worker log;
    its call then runs as the sweep's `--worker` (here one the sweep refuses: one line, code 2)."""
    done = _fresh(f"""
        waiting = prefork.start_early(["mlptrain", "sweep", "s.yaml", "--workers", "2"])
        if waiting is not None:
            print("said before the call", flush=True)
            from mlptrain.cli.sweep import serve_planned
            serve_planned(waiting)
        planned, ended = prefork.take_planned(["2", "0"])
        from mlptrain.sweep.forked import Forked
        planned[0].stop()
        child = planned[1]
        child.send(dict(sweep_file="missing.yaml", overrides=[], runs_dir="runs", name="s", url="s.journal", share=1,
                        pack=1, log="worker-1.log"))
        print("code", Forked(child.pid, child.done).wait(60))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["code", "2"]
    log = (tmp_path / "worker-1.log").read_text().splitlines()
    assert log[0] == "said before the call" and log[1].startswith("error: missing.yaml: no such sweep file")


SMALL = ["train.epochs=1", "model.hidden=[8]", "train.batch_size=1024", "data.val_size=1000"]


def _sweep_on_three_gpus(tmp_path, data_dir, *overrides) -> subprocess.CompletedProcess:
    """`mlptrain sweep` through its entry on a machine whose NVIDIA driver lists three GPUs and whose CUDA
    offers none (no libcuda here): each child falls back to the CPU backend, as a run would."""
    (tmp_path / "s.yaml").write_text("base: adam_mnist\nmethod: grid\nmetric: val_acc\n"
                                     "parameters:\n  seed: [0, 1, 2]\n")
    return _fresh(f"""
        sys.argv = ["mlptrain", "sweep", "s.yaml", *{list(overrides)!r}, "--runs-dir", "runs", "--name", "s",
                    "--workers", "2"]
        os.environ["MLPTRAIN_DATA_DIR"] = {str(data_dir)!r}
        from mlptrain import __main__ as entry
        entry.main()
    """, tmp_path)


def test_a_sweep_forked_per_gpu_trains_in_its_children_only(tmp_path, data_dir):
    """The command trains on none of the GPUs: a child per GPU takes the trials, each once, and the command
    reports each and writes the results."""
    done = _sweep_on_three_gpus(tmp_path, data_dir, *SMALL)
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join((done.stdout + done.stderr).split())
    assert "2 workers in 2 processes, one per GPU (1 on GPU 2, 1 on GPU 0); their output goes to" in out
    assert all(f"trial {i} complete: val_acc" in out for i in range(3))
    results = json.loads((tmp_path / "runs" / "s" / "results.json").read_text())
    assert sorted(t["params"]["seed"] for t in results["trials"]) == [0, 1, 2]
    assert {t["state"] for t in results["trials"]} == {"complete"}
    logs = [(tmp_path / "runs" / "s" / f"worker-{i}.log").read_text() for i in range(2)]
    # every trial trained in exactly one child (one child may have taken them all, on a busy machine), the
    # fallback in the log of each that trained; the command's own output holds no trial's training
    trained = [[i for i in range(3) if f"trial-000{i}: " in log] for log in logs]
    assert sorted(sum(trained, [])) == [0, 1, 2]
    assert all("running on the CPU" in log for log, mine in zip(logs, trained) if mine)
    assert out.count("warning: trial") == 1 and "no usable GPU" in out  # and once where the command says it
    assert "parameters on" not in done.stdout + done.stderr


def test_a_sweep_forked_per_gpu_refuses_its_data_in_one_line_and_leaves_nothing(tmp_path, data_dir):
    """The command checks the data once its study is open (the children wait for it): a refusal then stops
    the children and removes the new sweep's folder."""
    done = _sweep_on_three_gpus(tmp_path, data_dir, "data.val_size=100000000", *SMALL[:3])
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("error:") == 1 and "data.val_size" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "runs" / "s").exists()


def _sweep_in_a_trainer(tmp_path, data_dir, *args) -> subprocess.CompletedProcess:
    """`mlptrain sweep` of one worker through its entry on a machine whose NVIDIA driver lists GPUs and whose
    CUDA offers none: its trainer falls back to the CPU backend, as a run would."""
    (tmp_path / "s.yaml").write_text("base: adam_mnist\nmethod: grid\nmetric: val_acc\n"
                                     "parameters:\n  seed: [0, 1, 2]\n")
    return _fresh(f"""
        sys.argv = ["mlptrain", "sweep", "s.yaml", *{list(args)!r}, "--runs-dir", "runs", "--name", "s"]
        os.environ["MLPTRAIN_DATA_DIR"] = {str(data_dir)!r}
        from mlptrain import __main__ as entry
        try:
            entry.main()
        finally:  # the command's, as it ends (the trainer ends with os._exit before this)
            print("numba here", "numba" in sys.modules, flush=True)
    """, tmp_path)


def test_a_single_gpu_sweep_trains_in_its_trainer_and_the_command_keeps_the_study(tmp_path, data_dir):
    """Every trial trained once, in the trainer (the command never imports the training's modules), the
    study and the results written by the command."""
    done = _sweep_in_a_trainer(tmp_path, data_dir, *SMALL, "--pack", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join((done.stdout + done.stderr).split())
    assert "one worker, each training 2 trials at once" in out and "numba here False" in out
    assert all(f"trial {i}: val_acc" in out for i in range(3))
    results = json.loads((tmp_path / "runs" / "s" / "results.json").read_text())
    assert sorted(t["params"]["seed"] for t in results["trials"]) == [0, 1, 2]
    assert {t["state"] for t in results["trials"]} == {"complete"}
    assert sorted(p.name for p in (tmp_path / "runs" / "s").glob("trial-*")) == [f"trial-000{i}" for i in range(3)]


def test_a_sweeps_trainer_refuses_its_data_in_one_line_and_leaves_nothing(tmp_path, data_dir):
    done = _sweep_in_a_trainer(tmp_path, data_dir, "data.val_size=100000000", *SMALL[:3])
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("error:") == 1 and "data.val_size" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "runs" / "s").exists()
