"""A process per GPU forked from the sweep command (mlptrain.sweep.forked), without a GPU: which GPUs the
command counts without starting CUDA, that nothing it imports before the fork starts a thread, and what a
forked child does with its output, its GPU, its exit code and a signal.

The forks happen in a fresh interpreter (a subprocess): pytest's own process has NumPy's threads, and a
fork is only made from a process with none (`can_fork`)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from mlptrain.sweep.gpu_processes import visible_slots

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def driver_folder(tmp_path):
    """The NVIDIA driver's folder of a machine with `n` GPUs."""
    def machine(n: int):
        folder = tmp_path / "gpus"
        folder.mkdir()
        for i in range(n):
            (folder / f"0000:{i:02x}:00.0").mkdir()
        return folder
    return machine


@pytest.mark.parametrize("visible, slots", [
    (None, ["0", "1", "2", "3"]),
    ("2,0", ["2", "0"]),
    (" 3 , 1 ", ["3", "1"]),
    ("1,7,2", ["1"]),  # CUDA stops reading at the first index the driver has no GPU for
    ("1,1", ["1"]),  # nor does it repeat a GPU
    ("", []),
    ("-1", []),
    ("GPU-5e2a8f7c,1", None),  # UUIDs and MIG instances: only the driver can tell, so no fork
    ("0,MIG-7d1c", None),
])
def test_the_gpus_are_counted_without_starting_cuda(driver_folder, visible, slots):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert visible_slots(environ, driver_folder(4)) == slots


def test_no_driver_folder_or_the_simulator_count_nothing(driver_folder, tmp_path):
    assert visible_slots({}, tmp_path / "missing") is None
    assert visible_slots({"NUMBA_ENABLE_CUDASIM": "1"}, driver_folder(2)) is None


def _fresh(script: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO})


def test_the_sweep_command_forks_before_anything_starts_a_thread(tmp_path):
    """What `mlptrain sweep` imports and reads before it forks (the CLI, the sweep file, its config) starts
    no thread and leaves NumPy (whose BLAS starts threads) unimported, so its children fork clean."""
    done = _fresh("""
        import sys
        import mlptrain.cli
        from mlptrain.cli.sweep import resolve_sweep
        from mlptrain.config.load import config_from_dict
        from mlptrain.sweep.gpu_processes import can_fork, threads_now, visible_slots
        from mlptrain.sweep.spec import load_sweep
        from mlptrain.sweep.storage import absolute, check_storage, default_storage
        spec = load_sweep(resolve_sweep("sweep_lr_mnist"), ["train.epochs=1"])
        config_from_dict(spec.raw)
        visible_slots()
        print("numpy" in sys.modules, threads_now(), can_fork())
    """, tmp_path)
    assert done.stdout.split() == ["False", "1", "True"], done.stderr
    assert done.returncode == 0


def test_a_forked_child_writes_its_log_pins_its_gpu_and_exits_with_its_code(tmp_path):
    done = _fresh(f"""
        import os, sys
        from pathlib import Path
        from mlptrain.errors import UserError
        from mlptrain.sweep.forked import fork_child
        from mlptrain.util.console import console
        print("before the fork", flush=False)  # pending in the buffer: printed once, by the command

        def fine():
            console.print("child on GPU " + os.environ["CUDA_VISIBLE_DEVICES"], highlight=False)
            print("session", os.getsid(0) == os.getpid())

        def refused():
            raise UserError("no data [here]")

        def crashed():
            raise ZeroDivisionError("boom")

        def interrupted():
            raise KeyboardInterrupt

        codes = [fork_child(run, Path({str(tmp_path)!r}) / f"worker-{{i}}.log", str(i)).wait(60)
                 for i, run in enumerate([fine, refused, crashed, interrupted, lambda: 3])]
        print("codes", *codes, "here", os.environ.get("CUDA_VISIBLE_DEVICES"))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["before the fork", "codes 0 2 1 130 3 here None"]
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(5)]
    assert logs[0] == "child on GPU 0\nsession True\n"  # no colours: a log, not the command's terminal
    assert logs[1] == "error: no data [here]\n"
    assert "ZeroDivisionError: boom" in logs[2] and "Traceback" in logs[2]
    assert logs[3] == logs[4] == ""


def test_a_forked_child_is_stopped_and_reaped_as_a_started_one(tmp_path):
    done = _fresh(f"""
        import signal, time
        from pathlib import Path
        from mlptrain.sweep.forked import fork_child
        from mlptrain.sweep.workers import stop_workers
        import mlptrain.sweep.workers as workers

        child = fork_child(lambda: time.sleep(60), Path({str(tmp_path)!r}) / "worker-1.log", None)
        assert child.poll() is None
        started = time.monotonic()
        stop_workers([child], signal.SIGTERM)
        print(child.returncode, child.poll(), time.monotonic() - started < 30)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(-signal.SIGTERM), str(-signal.SIGTERM), "True"]


def test_waiting_for_a_forked_child_times_out_as_popen_does(tmp_path):
    done = _fresh(f"""
        import signal, subprocess
        from pathlib import Path
        from mlptrain.sweep.forked import fork_child

        child = fork_child(signal.pause, Path({str(tmp_path)!r}) / "worker-1.log", None)  # waits to be killed
        try:
            child.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            print("timed out")
        child.kill()
        print(child.wait(timeout=30), child.poll())
        child.send_signal(signal.SIGTERM)  # an ended child: nothing is sent
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["timed out", f"{-signal.SIGKILL} {-signal.SIGKILL}"]


def test_a_forked_child_says_it_is_done_before_its_process_ends(tmp_path):
    """The command goes on once a child's work is done (its code through a pipe), while the child's process
    still ends (a GPU context's teardown); `wait` waits for that end."""
    done = _fresh(f"""
        import os, time
        from pathlib import Path
        from mlptrain.sweep.forked import fork_child

        real_exit = os._exit
        os._exit = lambda code: (time.sleep(1.5), real_exit(code))  # a slow end, in the child only
        child = fork_child(lambda: 7, Path({str(tmp_path)!r}) / "worker-1.log", None)
        os._exit = real_exit
        started = time.monotonic()
        while child.poll() is None:
            time.sleep(0.01)
        said = time.monotonic() - started
        print(child.poll(), said < 1.0, child.wait(timeout=30), time.monotonic() - started >= 1.4)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["7", "True", "7", "True"]


def test_a_forked_child_says_its_code_before_its_exit_handlers_run(tmp_path):
    """The exit handlers a child's work registered (the drawing processes' shutdown) run after its code is said:
    they decide nothing the command waits for. They still run, before the process ends."""
    done = _fresh(f"""
        import atexit, time
        from pathlib import Path
        from mlptrain.sweep.forked import fork_child

        marker = Path({str(tmp_path)!r}) / "handler"

        def work():
            atexit.register(lambda: (time.sleep(1.5), marker.write_text("ran")))
            return 3

        child = fork_child(work, Path({str(tmp_path)!r}) / "worker-1.log", None)
        started = time.monotonic()
        while child.poll() is None:
            time.sleep(0.01)
        said = time.monotonic() - started
        print(child.poll(), said < 1.0, marker.exists(), child.wait(timeout=30), marker.read_text())
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "True", "False", "3", "ran"]


def test_a_forked_child_whose_exit_handler_hangs_still_ends(tmp_path):
    """Once its code is said no command waits for a child: an exit handler that never returns ends with the process
    after forked.EXIT_HANDLERS_S, and the child does not outlive the command holding its GPU."""
    done = _fresh(f"""
        import atexit, threading, time
        from pathlib import Path
        from mlptrain.sweep import forked

        forked.EXIT_HANDLERS_S = 1.0

        def work():
            atexit.register(lambda: threading.Event().wait())  # never returns
            return 5

        child = forked.fork_child(work, Path({str(tmp_path)!r}) / "worker-1.log", None)
        started = time.monotonic()
        try:
            print(child.wait(timeout=30), time.monotonic() - started < 20)
        finally:
            child.kill()  # a child that failed to end is not left behind
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "True"]


def test_no_fork_once_the_driver_has_started(tmp_path):
    """A child forked after cuInit could not use the GPU: once the command has started the driver (its thread
    ended or not), it forks nothing more and its workers are threads."""
    done = _fresh("""
        import time
        from mlptrain.backends.driver.early import start_driver
        from mlptrain.sweep.gpu_processes import can_fork, threads_now
        before = can_fork()
        start_driver()
        time.sleep(0.5)  # its thread has ended: no driver here, or cuInit done
        print(before, threads_now(), can_fork())
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1", "False"]
