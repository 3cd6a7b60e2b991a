"""`mlptrain sweep --pack K`: K trials trained side by side from one thread (mlptrain.packing.side_by_side).

A packed trial's metrics, parameters and per-step gradient norms are bit for bit those of the same trial
trained alone (here on the CPU backend; on the GPU each trial keeps its own stream and kernels, checked by
the real-GPU test at the end); the trials really are interleaved; Ctrl-C queues every packed trial again; an
error outside a trial stops the others. The driver itself (`side_by_side`) is tested on plain generators.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import optuna
import pytest
import typer

from mlptrain.errors import UserError
from mlptrain.sweep import claims, engine
from mlptrain.packing import lane_group
from mlptrain.packing.side_by_side import side_by_side
from mlptrain.training.steps import Period, finish
from tests.cli.test_cli import REPO
from tests.sweep.test_claims import journal, sweep_file
from tests.sweep.test_sweep import run_sweep, study_trials, write_sweep
from tests.sweep.test_threads import LEARNED

GRID = {"optim.lr": [0.001, 0.003], "seed": [0, 1]}  # 4 trials differing in lr and seed


def counter(name, steps, log, fail_at=None, stop=None):
    for i in range(steps):
        log.append((name, i))
        if i == fail_at:
            raise RuntimeError(f"{name} failed")
        if stop is not None and stop.signum:
            return f"{name} stopped"
        yield
    return name


class Stop:
    signum = 0


def test_side_by_side_advances_each_run_in_turn_and_returns_what_each_returned():
    log = []
    assert side_by_side([counter("a", 2, log), counter("b", 3, log)]) == ["a", "b"]
    assert log == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2)]
    assert finish(counter("c", 3, [])) == "c"


class Mark:
    """A device mark: done once `ready()` says so, or once waited for."""

    def __init__(self, ready=lambda: False):
        self.ready, self.waited = ready, False

    def done(self):
        return self.ready() or self.waited

    def wait(self):
        self.waited = True


def test_a_run_waiting_for_its_mark_is_passed_over_while_the_others_step():
    log = []
    mark = Mark(lambda: ("b", 2) in log)  # its steps have run once b has queued three

    def reader():
        log.append(("a", "queued"))
        yield mark  # about to read: its steps must have run first
        log.append(("a", "read"))

    assert side_by_side([reader(), counter("b", 5, log)]) == [None, "b"]
    assert log == [("a", "queued"), ("b", 0), ("b", 1), ("b", 2), ("a", "read"), ("b", 3), ("b", 4)]
    assert not mark.waited


def test_when_every_run_waits_the_host_waits_for_one():
    marks, log = [Mark(), Mark()], []

    def reader(name, mark):
        yield mark
        log.append(name)

    side_by_side([reader("a", marks[0]), reader("b", marks[1])])
    assert marks[0].waited and sorted(log) == ["a", "b"]


def test_runs_waiting_on_one_mark_ask_it_once_a_round():
    """A lockstep group's lanes wait on their read's one mark: asked once a round, not by each (each a driver call);
    a run whose mark is its own is still asked."""
    asked = []

    class Counted(Mark):
        def done(self):
            asked.append(self)
            return super().done()

    shared, own, log = Counted(), Counted(), []

    def reader(name, mark):
        yield mark
        log.append(name)

    side_by_side([reader("a", shared), reader("b", shared), reader("c", shared), reader("d", own)])
    assert sorted(log) == ["a", "b", "c", "d"] and shared.waited
    first_round = asked[:2]
    assert first_round == [shared, own]  # b and c were not asked after a, in the same round


def test_runs_started_together_spread_their_epochs_ends_by_their_period():
    log = []

    def periodic(name):
        yield Period(6)  # an epoch of 6 steps: run i of 3 starts 2 * i rounds after the first
        yield from counter(name, 4, log)

    side_by_side([periodic("a"), periodic("b"), periodic("c")])
    assert [f"{name}{i}" for name, i in log] == "a0 a1 a2 b0 a3 b1 b2 c0 b3 c1 c2 c3".split()


def test_an_error_in_one_run_stops_the_others_after_their_step_then_is_raised():
    log, stop = [], Stop()
    runs = [counter("a", 5, log, fail_at=1), counter("b", 5, log, stop=stop)]
    with pytest.raises(RuntimeError, match="a failed"):
        side_by_side(runs, stop)
    assert stop.signum == signal.SIGTERM
    assert log == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]  # b saw the stop at its next step and ended


def test_without_a_stop_an_error_closes_the_others_where_they_stand():
    log, closed = [], []

    def watched():
        try:
            yield from counter("b", 5, log)
        finally:
            closed.append(True)

    with pytest.raises(RuntimeError, match="a failed"):
        side_by_side([counter("a", 5, log, fail_at=1), watched()])
    assert closed == [True] and log == [("a", 0), ("b", 0), ("a", 1)]


def test_an_error_outside_the_runs_closes_every_run_where_it_stands():
    """The lanes' flush failing (a launch refused), or the wait for a device mark: no run can go on, so each is
    closed at once, in this thread, its cleanup run (left open, a packed sweep's runs were closed at the
    interpreter's exit, and it hung there)."""
    class Lanes:
        stagger = False

        def waits(self, lane):
            return False

        def ready(self):
            return True

        def flush(self, stop=None):
            raise RuntimeError("cuGraphLaunch failed")

    class Failing(Mark):
        def wait(self):
            raise RuntimeError("cuEventSynchronize failed")

    def watched(name, closed, mark=None):
        try:
            if mark is not None:
                yield mark
            yield from counter(name, 5, [])
        finally:
            closed.append(name)

    for failure, lanes, mark in (("cuGraphLaunch", Lanes(), None), ("cuEventSynchronize", None, Failing())):
        closed = []
        try:
            side_by_side([watched("a", closed, mark), watched("b", closed, mark)], Stop(), lanes=lanes)
        except RuntimeError as err:  # checked here, while its traceback holds side_by_side's frame and its runs
            assert failure in str(err)
            assert sorted(closed) == ["a", "b"]
        else:
            pytest.fail(f"{failure}: not raised")


def trial_results(runs_dir, name):
    results = json.loads((runs_dir / name / "results.json").read_text())
    by_params = {}
    for t in results["trials"]:
        run_dir = runs_dir / name / os.path.basename(t["run_dir"])
        arrays = dict(np.load(run_dir / "checkpoints" / "last.npz"))
        by_params[(t["params"]["optim.lr"], t["params"]["seed"])] = (
            t["state"], {k: v for k, v in t["metrics"].items() if k in LEARNED}, arrays,
            np.load(run_dir / "grad_norms.npy"), (run_dir / "metrics.jsonl").read_text())
    return by_params


@pytest.mark.parametrize("stagger", [False, True])
def test_packed_trials_match_the_same_trials_trained_alone_bitwise(tmp_path, tiny_mnist, trains, monkeypatch, stagger):
    """In lanes, in lockstep or staggered (lane_group.STAGGER): every trial's bits are its run's alone."""
    monkeypatch.setattr(lane_group, "STAGGER", stagger)
    path = write_sweep(tmp_path, GRID)
    run_sweep(path, tmp_path / "runs", name="alone", overrides=["train.epochs=2"])
    order = []
    real = engine.training

    def traced(session, *args, **kwargs):  # each trial's first and last step, in the order they ran
        steps = real(session, *args, **kwargs)
        order.append(("begin", session.config.seed, session.config.optim.lr))
        summary = yield from steps
        order.append(("end", session.config.seed, session.config.optim.lr))
        return summary

    monkeypatch.setattr(engine, "training", traced)
    run_sweep(path, tmp_path / "runs", name="packed", overrides=["train.epochs=2"], pack=4)
    assert [kind for kind, *_ in order] == ["begin"] * 4 + ["end"] * 4  # all four trained at once
    alone, packed = trial_results(tmp_path / "runs", "alone"), trial_results(tmp_path / "runs", "packed")
    lanes = [json.loads(path.read_text()).get("lanes") for path in (tmp_path / "runs").glob("*/*/summary.json")]
    assert sorted(map(str, lanes)) == ["None"] * 4 + [str({"of": 4, "lane": i, "gemm": "fma"})
                                                      for i in range(4)]  # in lanes
    assert sorted(alone) == sorted(packed) and len(alone) == 4
    for key, (state, metrics, arrays, norms, lines) in alone.items():
        p_state, p_metrics, p_arrays, p_norms, p_lines = packed[key]
        assert state == p_state == "complete" and metrics == p_metrics and len(metrics) == len(LEARNED)
        # a lane logs an epoch that is not its last during the next one (queued_end.logs_later; its whole end, queued_end): the same records
        assert lines == p_lines and [json.loads(line)["epoch"] for line in lines.splitlines()] == [1, 2]
        assert sorted(arrays) == sorted(p_arrays)
        for name, array in arrays.items():
            if not name.startswith("meta/"):  # wall_s and the like differ; every learned array must not
                np.testing.assert_array_equal(array, p_arrays[name], err_msg=name)
        assert norms.tobytes() == p_norms.tobytes()


def test_more_trials_than_the_pack_run_each_once(tmp_path, tiny_mnist, trains):
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002, 0.003, 0.004, 0.005]})
    results = run_sweep(path, tmp_path / "runs", pack=2)
    assert [t["state"] for t in results["trials"]] == ["complete"] * 5
    assert sorted(c.optim.lr for c in trains) == [0.001, 0.002, 0.003, 0.004, 0.005]


def test_packed_trials_name_themselves_in_their_epoch_lines(tmp_path, tiny_mnist, capsys):
    """Trials training at once print their epochs' lines in turn: each line starts with its trial's folder."""
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002]})
    run_sweep(path, tmp_path / "runs", overrides=["train.epochs=1"], pack=2)
    lines = [line for line in capsys.readouterr().err.splitlines() if " epoch 1: train loss" in line]
    assert sorted(line.split()[0] for line in lines) == ["trial-0000", "trial-0001"], lines


def test_a_packed_trial_whose_images_cannot_be_drawn_apart_records_the_fallback(tmp_path, tiny_mnist, monkeypatch):
    """Drawn apart (as packed trials on a GPU are: training.loop.draws_apart), a drawing process that cannot start
    is each trial's recorded fallback, and its confusion images are drawn beside the training after all."""
    from mlptrain.run_dirs import drawing
    from mlptrain.training import loop

    def no_process():
        raise OSError("no processes here")

    monkeypatch.setattr(loop, "draws_apart", lambda s, progress: True)
    monkeypatch.setattr(drawing, "_processes", no_process)
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002]})
    run_sweep(path, tmp_path / "runs", overrides=["train.epochs=1"], pack=2)
    for trial in ("trial-0000", "trial-0001"):
        run_dir = tmp_path / "runs" / "s" / trial
        fallbacks = json.loads((run_dir / "summary.json").read_text())["fallbacks"]
        assert [line for line in fallbacks if "not in a process of their own (OSError: no processes here)" in line]
        assert any(b"confusion/val" in events.read_bytes() for events in run_dir.glob("events.out.tfevents.*"))


def test_ctrl_c_queues_every_packed_trial_again_and_a_rerun_finishes_them(tmp_path, tiny_mnist, trains, monkeypatch):
    real, steps = engine.training, []

    def interrupted_midway(session, *args, **kwargs):  # Ctrl-C once three trials have each queued a step
        run = real(session, *args, **kwargs)
        while True:
            try:
                next(run)
            except StopIteration as end:
                return end.value
            steps.append(session.config.optim.lr)
            if len(steps) == 4:
                os.kill(os.getpid(), signal.SIGINT)  # the handler sets the stop: no trial sees an exception
            yield

    monkeypatch.setattr(engine, "training", interrupted_midway)
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002, 0.003, 0.004]})
    # two epochs: a lane's loop hands in its windows up to its next read before it yields (training.loop.window_spans),
    # so by the fourth yield a one-epoch trial's steps were all launched
    two_epochs = ["train.epochs=2"]
    with pytest.raises(typer.Exit) as stopped:
        run_sweep(path, tmp_path / "runs", two_epochs, pack=3)
    assert stopped.value.exit_code == 130
    assert sorted(set(steps)) == [0.001, 0.002, 0.003]  # the fourth never began
    half = study_trials(tmp_path / "runs" / "s")
    retried = sorted(t.user_attrs["retry_of"] for t in half if "retry_of" in t.user_attrs)
    assert sorted(t.state.name for t in half) == ["FAIL"] * 3 + ["WAITING"] * 4 and retried == [0, 1, 2]
    monkeypatch.setattr(engine, "training", real)
    results = run_sweep(path, tmp_path / "runs", two_epochs, pack=3)
    done = [t["params"]["optim.lr"] for t in results["trials"] if t["state"] == "complete"]
    assert sorted(done) == [0.001, 0.002, 0.003, 0.004]


def test_pack_is_checked(tmp_path, tiny_mnist):
    path = write_sweep(tmp_path, GRID)
    for pack in (0, 65):
        with pytest.raises(UserError, match=f"--pack {pack}: must be in"):
            run_sweep(path, tmp_path / "runs", pack=pack)
    assert not (tmp_path / "runs").exists()


@pytest.mark.real_gpu
def test_packed_trials_on_the_gpu_match_trials_trained_one_at_a_time(tmp_path, data_dir):
    """Packed trials in lanes (one step of every lane at once): every trial's metrics within float32 rounding of
    the same trial's in a one-worker sweep (a lane's GEMMs sum in another order), and the same bits whenever the
    same pack trains them."""
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.003], "seed": [0, 1]})
    overrides = ["backend=cuda", "train.epochs=2", "model.hidden=[64]", "data.val_size=1000", "train.batch_size=256"]
    metrics = {}
    for name, pack in (("p1", 1), ("p4", 4), ("p3", 3), ("p4-again", 4)):
        done = subprocess.run([sys.executable, "-m", "mlptrain", "sweep", str(path), *overrides, "--runs-dir",
                               str(tmp_path / "runs"), "--name", name, "--pack", str(pack)], cwd=REPO,
                              env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        results = json.loads((tmp_path / "runs" / name / "results.json").read_text())
        assert [t["state"] for t in results["trials"]] == ["complete"] * 4
        metrics[name] = {(t["params"]["optim.lr"], t["params"]["seed"]):
                         {k: v for k, v in t["metrics"].items() if k in LEARNED} for t in results["trials"]}
    assert metrics["p4"] == metrics["p4-again"]
    assert all(len(m) == len(LEARNED) for m in metrics["p1"].values())
    for packed in (metrics["p4"], metrics["p3"]):
        for trial, values in metrics["p1"].items():
            for key, value in values.items():
                assert abs(packed[trial][key] - value) <= 0.01 * (1.0 if "acc" in key else abs(value)), (trial, key)


def test_sigterm_stops_packed_worker_processes_and_queues_every_trial_again(tmp_path, data_dir):
    """`--workers 2 --pack 2` on the CPU: two processes, each training two trials side by side; SIGTERM queues
    all four running trials again (a re-run takes them: test_ctrl_c_queues_every_packed_trial_again...)."""
    path, _ = sweep_file(tmp_path, 5)
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), "backend=cpu", "train.epochs=200",
               "model.hidden=[8]", "train.batch_size=5000", "data.val_size=1000", "train.eval_batch_size=10000",
               "--runs-dir", str(tmp_path / "runs"), "--name", "t", "--workers", "2", "--pack", "2"]
    env = {**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    study_file = tmp_path / "runs" / "t" / "study.journal"
    deadline, running = time.monotonic() + 120, []
    while len(running) < 4 and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.5)
        if study_file.exists():
            try:
                storage = journal(study_file)
                trials = storage.get_all_trials(storage.get_study_id_from_name("t"), deepcopy=False)
            except KeyError:  # not created yet
                continue
            running = [t for t in trials if t.state.name == "RUNNING"]
    assert len(running) == 4, parent.communicate(timeout=60)[0] if parent.poll() is not None else "not 4 running"
    assert len({t.system_attrs[claims.WORKER]["pid"] for t in running}) == 2  # two trials in each process
    parent.send_signal(signal.SIGTERM)
    out = parent.communicate(timeout=90)[0]
    assert parent.returncode == 143 and "Traceback" not in out, out
    trials = optuna.load_study(study_name="t", storage=journal(study_file)).get_trials()
    retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    assert not [t for t in trials if t.state.name == "RUNNING"] and {t.number for t in running} <= retried


def test_a_trial_without_room_beside_the_others_is_queued_again_and_the_pack_shrinks(tmp_path, tiny_mnist, trains,
                                                                                   monkeypatch, capsys):
    from mlptrain.errors import OutOfMemory
    from mlptrain.training import session as sessions

    real, built = sessions.check_fits, []

    def third_does_not_fit(config, backend, dataset):
        built.append(config.optim.lr)
        if len(built) == 3:  # the third slot's first trial, beside two training ones
            raise OutOfMemory("the run needs 9 GiB of GPU memory, 1 GiB is free")
        real(config, backend, dataset)

    monkeypatch.setattr(sessions, "check_fits", third_does_not_fit)
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002, 0.003, 0.004, 0.005]})
    results = run_sweep(path, tmp_path / "runs", pack=3)
    assert sorted(t["params"]["optim.lr"] for t in results["trials"] if t["state"] == "complete") == \
        [0.001, 0.002, 0.003, 0.004, 0.005]
    assert all(t["state"] == "complete" for t in results["trials"])  # the refused attempt is its retry's
    assert "does not fit beside the trials this worker trains already" in capsys.readouterr().err


def test_a_trial_that_does_not_fit_alone_fails_as_before(tmp_path, tiny_mnist, monkeypatch):
    from mlptrain.errors import OutOfMemory
    from mlptrain.training import session as sessions

    def never_fits(config, backend, dataset):
        raise OutOfMemory("the run needs 9 GiB of GPU memory, 1 GiB is free")

    monkeypatch.setattr(sessions, "check_fits", never_fits)
    results = run_sweep(write_sweep(tmp_path, {"optim.lr": [0.001, 0.002]}), tmp_path / "runs", pack=2)
    assert [t["state"] for t in results["trials"]] == ["failed", "failed"]
    assert all("1 GiB is free" in t["error"] for t in results["trials"])


def test_a_seed_without_room_waits_for_a_slot_and_every_seed_runs(tmp_path, tiny_mnist, monkeypatch, capsys):
    from mlptrain.config.load import config_from_dict
    from mlptrain.errors import OutOfMemory
    from mlptrain.seeds.runner import run_seeds
    from mlptrain.training import session as sessions
    from mlptrain.training.experiment import Resources

    real, built = sessions.check_fits, []

    def third_does_not_fit(config, backend, dataset):
        built.append(config.seed)
        if len(built) == 3:
            raise OutOfMemory("the run needs 9 GiB of GPU memory, 1 GiB is free")
        real(config, backend, dataset)

    monkeypatch.setattr(sessions, "check_fits", third_does_not_fit)
    config = config_from_dict({"backend": "cpu", "model": {"hidden": [16]}, "data": {"val_size": 100},
                               "train": {"epochs": 1, "batch_size": 100, "eval_batch_size": 500}})
    group, record = run_seeds(config, [0, 1, 2, 3], tmp_path, "g", "tiny", Resources(), pack=3)
    assert record["seeds"] == [0, 1, 2, 3] and built == [0, 1, 2, 2, 3]  # seed 2 again, in a slot that stayed
    assert sorted(p.name for p in group.glob("seed-*")) == ["seed-0", "seed-1", "seed-2", "seed-3"]
    assert "seed 2 does not fit beside the seeds training already" in capsys.readouterr().err


def test_packed_trials_last_files_are_written_behind_the_training_thread(tmp_path, tiny_mnist, monkeypatch):
    """A run's last files (training.run_end) are written by the run-ends threads while the training thread goes
    on (its generator yields a Waitable for them), and each trial's folder ends whole with its summary."""
    from mlptrain.training import run_end

    real, writers = run_end._close, []

    def closing(s, logger, run_dir, norms, summary):
        writers.append(threading.current_thread().name)
        return real(s, logger, run_dir, norms, summary)

    monkeypatch.setattr(run_end, "_close", closing)
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002]})
    results = run_sweep(path, tmp_path / "runs", overrides=["train.epochs=1"], pack=2)
    assert [t["state"] for t in results["trials"]] == ["complete"] * 2
    assert len(writers) == 2 and all(name.startswith("mlptrain-run-ends") for name in writers), writers
    for run_dir in (tmp_path / "runs").glob("*/trial-*"):
        summary = json.loads((run_dir / "summary.json").read_text())
        assert "fallbacks" in summary and len(np.load(run_dir / "grad_norms.npy")) == summary["optimizer_steps"]
