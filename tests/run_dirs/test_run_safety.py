"""Nothing lost, one clear line: the run lock, a finished run without its summary, a full or read-only
disk, crafted checkpoints, absurd but well-typed values, Ctrl-C at start-up (CPU backend, tiny data)."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlptrain.backends.counting import CountingBackend
from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import config_from_dict, config_to_dict
from mlptrain.config.schema import INT64_MAX
from mlptrain.errors import UserError
from mlptrain.nn import model_dataset
from mlptrain.run_dirs.folders import write_yaml
from mlptrain.run_dirs.lock import release_run
from mlptrain.training.checkpoint import save_checkpoint
from mlptrain.training.loop import train
from mlptrain.training.memory_plan import check_fits, estimate
from mlptrain.training.resume import prepare_resume
from mlptrain.training.session import build_session
from mlptrain.util import atomic
from tests.cli.test_cli import REPO
from tests.training.test_accumulation import make_config, synthetic_dataset

LOCKER = "import sys, time; from mlptrain.run_dirs.lock import lock_run; lock_run(sys.argv[1], 'x'); print('locked', " \
         "flush=True); time.sleep(60)"


def trained_run(tmp_path, epochs=1, name="run"):
    from tests.training.test_resume import new_run

    run_dir = new_run(tmp_path, name, make_config(64, 4, epochs=epochs))
    train(build_session(make_config(64, 4, epochs=epochs), CpuBackend(), synthetic_dataset()), run_dir)
    release_run(run_dir)  # as when its process exits
    return run_dir


def test_a_second_process_on_a_run_is_refused_and_a_dead_one_frees_it(tmp_path):
    run_dir = trained_run(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", LOCKER, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(UserError, match=f"another process \\(pid {holder.pid}\\) is working in this run") as refused:
        prepare_resume(run_dir, ["train.epochs=2"])
    # it says what to do, and that it does not wait (a newcomer read "--resume waits" and expected it to)
    assert "try again once that process has finished (this command does not wait)" in str(refused.value)
    holder.kill()  # SIGKILL: the kernel drops its lock
    holder.wait()
    config, resume = prepare_resume(run_dir, ["train.epochs=2"])
    assert resume.position.epoch == 1
    release_run(run_dir)


def test_a_finished_run_without_its_summary_resumes_into_one(tmp_path):
    run_dir = trained_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    norms = np.load(run_dir / "grad_norms.npy")
    (run_dir / "summary.json").unlink()  # killed after the last checkpoint, before the summary
    config, resume = prepare_resume(run_dir, [])
    assert resume.finished
    again = train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir, resume=resume)
    release_run(run_dir)
    for key in ("test_acc", "val_acc", "test_loss", "optimizer_steps", "epochs"):
        assert again[key] == summary[key], key
    np.testing.assert_array_equal(np.load(run_dir / "grad_norms.npy"), norms)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1  # nothing evaluated again
    with pytest.raises(UserError, match="already trained 1 epochs"):
        prepare_resume(run_dir, [])
    release_run(run_dir)


@pytest.mark.parametrize("edit, fragment", [
    (lambda c: c["train"].update(batch_size=32), "train.batch_size (64 -> 32)"),
    (lambda c: c["optim"].update(name="sgd"), "optim.name (\"momentum\" -> \"sgd\")"),
    (lambda c: c["data"].update(val_size=50), "data.val_size (100 -> 50)"),
])
def test_a_hand_edited_config_is_refused_on_resume(tmp_path, edit, fragment):
    run_dir = trained_run(tmp_path)
    config = config_to_dict(make_config(64, 4, epochs=2))
    edit(config)
    write_yaml(run_dir / "config.yaml", config)
    with pytest.raises(UserError, match=None) as info:
        prepare_resume(run_dir, [])
    assert fragment in str(info.value) and "\n" not in str(info.value)
    release_run(run_dir)


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_previous(tmp_path, monkeypatch):
    path = tmp_path / "last.npz"
    save_checkpoint(path, {"params/w": np.ones(3, np.float32)})
    before = path.read_bytes()
    real = atomic.os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(UserError, match="last.npz: cannot write it \\(No space left on device\\)"):
        save_checkpoint(path, {"params/w": np.zeros(10**6, np.float32)})
    monkeypatch.setattr(atomic.os, "fsync", real)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.npz"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1.5 MiB tmpfs (root only; skipped, with the reason, where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mount)], capture_output=True)
    if result.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.decode().strip() or 'not root'}); the ENOSPC "
                    "test above covers the same path by monkeypatching")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_a_run_on_a_full_or_read_only_disk_is_one_line(tiny_disk, data_dir):
    env = {"MLPTRAIN_DATA_DIR": str(data_dir)}
    from tests.cli.test_cli import assert_clean_failure, mlptrain

    big = ["backend=cpu", "train.epochs=1", "model.hidden=[512]", "data.val_size=1000", "train.batch_size=1000"]
    result = mlptrain("run", "adam_mnist", *big, "--runs-dir", str(tiny_disk), "--name", "a", cwd=tiny_disk.parent,
                      env=env)
    assert_clean_failure(result, "needs about")  # 3 checkpoints of 1.6 MB do not fit in 1.5 MiB: refused up front
    small = ["backend=cpu", "train.epochs=1", "model.hidden=[8]", "data.val_size=1000", "train.batch_size=5000"]
    assert mlptrain("run", "adam_mnist", *small, "--runs-dir", str(tiny_disk), "--name", "b", cwd=tiny_disk.parent,
                    env=env).returncode == 0
    (tiny_disk / "b" / "summary.json").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    before = sorted(str(p) for p in tiny_disk.rglob("*"))
    assert_clean_failure(mlptrain("run", "--resume", str(tiny_disk / "b"), cwd=tiny_disk.parent, env=env),
                         "read-only file system")
    assert_clean_failure(mlptrain("extract-features", str(tiny_disk / "b"), "--checkpoint", "last",
                                  cwd=tiny_disk.parent, env=env), "read-only file system")
    assert sorted(str(p) for p in tiny_disk.rglob("*")) == before


@pytest.mark.parametrize("key, value, fragment", [
    ("params/fc1.weight", np.array(["a", "b"]), "holds <U1 values, not numbers"),
    ("optim/m", np.array([np.inf], np.float32), "holds NaN or infinite values"),
    ("meta/epoch", np.array([1, 2]), "must be a whole number >= 0"),
    ("meta/window", np.array(-1), "must be a whole number >= 0"),
])
def test_crafted_checkpoint_arrays_are_one_line(tmp_path, key, value, fragment):
    run_dir = trained_run(tmp_path)
    path = run_dir / "checkpoints" / "last.npz"
    arrays = dict(np.load(path))
    arrays[key] = value
    np.savez(path, **arrays)
    with pytest.raises(UserError, match=None) as info:
        prepare_resume(run_dir, ["train.epochs=2"])
    assert fragment in str(info.value) and key in str(info.value) and "\n" not in str(info.value)
    release_run(run_dir)


def test_a_step_state_out_of_range_is_refused(tmp_path):
    run_dir = trained_run(tmp_path)
    path = run_dir / "checkpoints" / "last.npz"
    arrays = dict(np.load(path))
    arrays["step/state"][0] = 2.5  # half a step (a NaN step state is refused the same way)
    np.savez(path, **arrays)
    config, resume = prepare_resume(run_dir, ["train.epochs=2"])
    with pytest.raises(UserError, match="step count that is not a whole number"):
        train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir, resume=resume)
    release_run(run_dir)


# ---- absurd but well-typed values: the config refuses them, or the estimate does, in one line

INT_KEYS = ["seed", "train.epochs", "train.batch_size", "train.eval_batch_size", "train.log_every",
            "train.grad_accum_steps", "train.checkpoint_every_epochs", "schedule.step_size", "schedule.patience",
            "schedule.warmup_steps", "schedule.d_model", "train.loss_scale.growth_interval", "data.val_size"]


def nested(dotted, value):
    out = node = {}
    *parents, leaf = dotted.split(".")
    for part in parents:
        node[part] = {}
        node = node[part]
    node[leaf] = value
    return out


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(INT_KEYS + ["model.hidden"]),
       st.one_of(st.integers(-2**70, 2**70), st.sampled_from([2**31, 2**63, 10**12, 10**20, 2**63 - 1])))
def test_absurd_integers_are_refused_or_fit(key, value):
    value = [value] if key == "model.hidden" else value
    try:
        config = config_from_dict({"backend": "cpu", "schedule": {"name": "step"}, **nested(key, value)})
    except UserError as err:
        assert "\n" not in str(err)
        return
    dataset = model_dataset(config, synthetic_dataset())
    try:
        check_fits(config, CpuBackend(), dataset)
    except UserError as err:
        assert "\n" not in str(err) and any(says in str(err) for says in (
            "would fit", "no batch size fits", "alone do not", "at most", "val_size"))


def test_the_estimate_covers_what_training_allocates():
    """The counted device bytes of a small run are those its buffers take, within a few percent."""
    import tracemalloc

    config = make_config(64, 4, epochs=2)
    dataset = synthetic_dataset()
    need, rows, steps = estimate(config, CpuBackend(), model_dataset(config, dataset))
    tracemalloc.start()
    session = build_session(config, CpuBackend(), dataset)
    allocated = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert session.model.max_rows == rows and need.device <= allocated * 1.1 and need.device >= allocated * 0.5


@pytest.mark.parametrize("val_size, own_val", [(100, False), (0.25, False), (100, True)])
def test_the_hosts_need_alone_is_the_whole_estimates(val_size, own_val):
    """Without the device's layout (a packed group's later lanes), the host's need and the optimizer steps are the
    whole estimate's, for a held-out split (a count, a fraction) and a dataset's own validation split."""
    import dataclasses

    dataset = synthetic_dataset(train=900)
    if own_val:
        dataset = dataclasses.replace(dataset, val_images=dataset.test_images[:50], val_labels=dataset.test_labels[:50])
    config = config_from_dict({**config_to_dict(make_config(64, 2, epochs=3)), "data": {"val_size": val_size}})
    dataset = model_dataset(config, dataset)
    whole, rows, steps = estimate(config, CpuBackend(), dataset)
    host, host_rows, host_steps = estimate(config, CpuBackend(), dataset, device=False)
    assert (host.host, host_rows, host_steps) == (whole.host, rows, steps) and host.device == host.per_row_device == 0
    assert steps == 3 * -(-build_session(config, CpuBackend(), dataset).train.size // 128)


def test_a_gpu_that_will_not_say_its_free_memory_is_checked_on_the_host_alone(monkeypatch):
    """A later lane's backend (free memory unknown: nothing new is allocated on the device) is checked on the host
    without laying the device buffers out, and a host that is too small still refuses it."""
    import mlptrain.training.memory_plan as memory

    class Lane(CpuBackend):
        name = "cuda"

    config = make_config(64, 2)
    dataset = model_dataset(config, synthetic_dataset())
    laid_out = []
    monkeypatch.setattr(memory, "_device_bytes", lambda *args: laid_out.append(args) or (0, 0, 0))
    monkeypatch.setattr(memory, "available", lambda backend: (None, 10**12))
    check_fits(config, Lane(), dataset)
    assert laid_out == []
    monkeypatch.setattr(memory, "available", lambda backend: (None, 1000))
    with pytest.raises(UserError, match="of host memory") as info:
        check_fits(config, Lane(), dataset)
    assert laid_out == [] and "\n" not in str(info.value)


def test_a_batch_too_large_for_memory_names_one_that_fits(monkeypatch):
    import mlptrain.training.memory_plan as memory

    config = config_from_dict({"backend": "cpu", "model": {"hidden": [4096, 4096]},
                               "train": {"batch_size": 50000, "grad_accum_steps": 2}})
    dataset = model_dataset(config, synthetic_dataset(train=20000))
    need, rows, _ = estimate(config, CpuBackend(), dataset)
    monkeypatch.setattr(memory, "available", lambda backend: (int((need.device + need.host) * 0.8), None))
    with pytest.raises(UserError, match=r"train.batch_size=\d+ train.grad_accum_steps=\d+ would fit") as info:
        check_fits(config, CpuBackend(), dataset)
    assert "\n" not in str(info.value)


def test_a_model_too_large_for_memory_says_what_it_may_use_and_why_no_batch_fits(monkeypatch):
    """Free memory a little above the need, but below what a run may use of it: the line must not read as
    room to spare ("needs 21.93 GiB and 22.81 GiB is free"), and it says the model itself is the problem."""
    import re

    import mlptrain.training.memory_plan as memory

    config = config_from_dict({"backend": "cpu", "model": {"hidden": [20000, 20000]}})
    dataset = model_dataset(config, synthetic_dataset())
    need, rows, _ = estimate(config, CpuBackend(), dataset)
    total = need.device + need.host
    monkeypatch.setattr(memory, "available", lambda backend: (int(total * 1.04), None))
    with pytest.raises(UserError) as info:
        check_fits(config, CpuBackend(), dataset)
    message = str(info.value)
    needs, may_use, free = (float(x.replace(",", "")) for x in re.findall(r"([\d,.]+) GiB", message)[:3])
    assert needs > may_use and free > needs and "kept for the system" in message
    assert "no batch size fits; make model.hidden or model.channels smaller" in message and "\n" not in message


def test_counting_backend_allocates_nothing():
    counting = CountingBackend(CpuBackend())
    huge = counting.empty((10**9, 10**4))
    assert counting.bytes == 4 * 10**13 and huge.strides == (0, 0)


def interpreter_start_s(env) -> float:
    """Twice the longest of three bare interpreter starts here: a Ctrl-C before that lands in Python's own
    start-up (its site module), before any code of ours can answer it."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
        times.append(time.perf_counter() - started)
    return 2 * max(times)


def test_ctrl_c_at_start_up_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLPTRAIN_DATA_DIR": str(tmp_path)}
    python = interpreter_start_s(env)
    for delay in (python + 0.02, python + 0.3, python + 0.8):
        proc = subprocess.Popen([sys.executable, "-m", "mlptrain", "run", "adam_mnist", "backend=cpu"], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert "Traceback" not in out + err and proc.returncode in (130, 2), (delay, err)
        lines = [line for line in err.splitlines() if line.strip()]
        # the signal may come after start-up, when the missing MNIST is reported (its own few lines)
        assert len(lines) <= 2 or lines[0].startswith("error: MNIST could not be downloaded"), err


def interrupted_command(script: str, folder):
    """Run `script` (a `mlptrain boom` command raising KeyboardInterrupt somewhere awkward): it must exit 130
    with the one line `interrupted`."""
    proc = subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted", (proc.returncode, proc.stderr)
    return proc


INTERRUPTED_IN_EXEC = """
import sys
from mlptrain import cli
def boom():
    exec("raise KeyboardInterrupt")  # as a Ctrl-C inside a dataclass's generated __init__ at import
cli.app.command("boom")(boom)
sys.argv = ["mlptrain", "boom"]
cli.main()
"""


def test_ctrl_c_inside_exec_generated_code_exits_130_with_one_line(tmp_path):
    # CPython marks a KeyboardInterrupt that escapes exec() of a string as unhandled and kills the process
    # with SIGINT at exit (-2, no message) even after it is caught: the failure CI met at random start-up times
    interrupted_command(INTERRUPTED_IN_EXEC, tmp_path)


INTERRUPTED_IN_CALLBACK = """
import sys, time, weakref
from mlptrain import cli
class Thing:
    pass
def boom():
    thing = Thing()
    def callback(ref):
        raise KeyboardInterrupt  # as a Ctrl-C landing in importlib's module-lock weakref callback at start-up
    kept = weakref.ref(thing, callback)
    del thing
    time.sleep(5)
    print("not interrupted", kept)
cli.app.command("boom")(boom)
sys.argv = ["mlptrain", "boom"]
cli.main()
"""


def test_ctrl_c_inside_a_weakref_callback_is_not_lost(tmp_path):
    # Python prints a KeyboardInterrupt raised in a callback as "Exception ignored in: ..." with a traceback,
    # then drops it: the command ran on to its next error (CI met it at a Ctrl-C 0.05 s into an import)
    proc = interrupted_command(INTERRUPTED_IN_CALLBACK, tmp_path)
    assert "not interrupted" not in proc.stdout


INTERRUPTED_IN_SET_NAME = """
import sys
from mlptrain import cli
class Field:
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt  # as a Ctrl-C landing in a dataclass field's __set_name__ at import
def boom():
    class Record:  # Python 3.11 wraps what __set_name__ raises in a RuntimeError
        value = Field()
cli.app.command("boom")(boom)
sys.argv = ["mlptrain", "boom"]
cli.main()
"""


def test_ctrl_c_wrapped_by_python_in_another_error_is_still_one_line():
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_IN_SET_NAME], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted", (proc.returncode, proc.stderr)


def test_int64_bound_is_what_a_checkpoint_holds():
    assert np.array(INT64_MAX, np.int64) == INT64_MAX


def test_a_run_folder_that_could_not_get_its_config_is_not_left_behind(tmp_path, monkeypatch):
    """A full disk at config.yaml left runs/<name>/ holding only .lock: a half-made run that took the name
    (`--name` then refused it: 'a run of that name exists') and that --resume could not use."""
    from mlptrain.training import experiment

    def full(path, data):
        raise UserError(f"{path}: cannot write it (No space left on device); the previous file, if any, is intact")

    monkeypatch.setattr(experiment, "write_yaml", full)
    with pytest.raises(UserError, match="No space left"):
        experiment.create_run(config_from_dict({}), tmp_path / "runs", "r", "stem")
    assert list((tmp_path / "runs").iterdir()) == []
    monkeypatch.undo()
    assert experiment.create_run(config_from_dict({}), tmp_path / "runs", "r", "stem") == tmp_path / "runs" / "r"
    release_run(tmp_path / "runs" / "r")
