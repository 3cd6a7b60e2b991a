"""Workers racing for trials: a claim is one transaction (one conditional UPDATE in a database, one line of a
journal file), so under load no trial is taken twice, and a trial is freed only when its worker is gone. Real
processes, bounded in time."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from mlptrain.sweep import claims
from tests.cli.test_cli import REPO

CLAIMER = """
import glob, sys, time, warnings, optuna
warnings.simplefilter("ignore")
from optuna.trial import TrialState
from mlptrain.sweep import claims
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
storage = (optuna.storages.RDBStorage(sys.argv[1], engine_kwargs={"connect_args": {"timeout": 60}}) if "://" in sys.argv[1]
           else JournalStorage(JournalFileBackend(sys.argv[1])))
study_id = storage.get_study_id_from_name("race")
open(sys.argv[2] + ".ready." + sys.argv[3], "w").close()
while not __import__("os").path.exists(sys.argv[2] + ".go"):  # all start together
    time.sleep(0.01)
mine = []
while True:
    waiting = [t for t in storage.get_all_trials(study_id, deepcopy=False) if t.state == TrialState.WAITING]
    if not waiting:
        break
    for trial in waiting:
        if claims.claim(storage, trial._trial_id, claims.this_worker()):
            mine.append(trial.number)
            if len(mine) == 1:  # every worker holds one before any takes a second: all four race, whatever the scheduler does
                open(sys.argv[2] + ".first." + sys.argv[3], "w").close()
                deadline = time.monotonic() + 60
                while len(glob.glob(sys.argv[2] + ".first.*")) < 4 and time.monotonic() < deadline:
                    time.sleep(0.01)
            time.sleep(0.001)
print(" ".join(map(str, mine)))
"""


def busy(n):
    """n processes that only burn CPU, for `under load`."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs):
    for proc in procs:
        proc.kill()
        proc.wait()


def journal(path) -> JournalStorage:
    """The journal file `path` as Optuna's storage (a sweep's default study)."""
    return JournalStorage(JournalFileBackend(str(path)))


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_concurrent_claims_take_each_trial_once(tmp_path, kind):
    url = f"sqlite:///{tmp_path}/race.db" if kind == "sqlite" else str(tmp_path / "race.journal")
    study = optuna.create_study(storage=url if kind == "sqlite" else journal(url), study_name="race")
    for i in range(200):
        study.enqueue_trial({"x": i})
    hogs = busy(2)
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        barrier = str(tmp_path / "barrier")
        procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, url, barrier, str(i)], stdout=subprocess.PIPE,
                                  text=True, env=env) for i in range(4)]
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("barrier.ready.*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        Path(barrier + ".go").touch()
        outputs = [p.communicate(timeout=120)[0].split() for p in procs]
    finally:
        stop(hogs)
    taken = sorted(int(n) for out in outputs for n in out)
    assert taken == list(range(200)), [len(o) for o in outputs]  # every trial once, none twice
    workers = {json.dumps(t.system_attrs[claims.WORKER], sort_keys=True) for t in study.get_trials()}
    assert len(workers) == 4 and all(t.state.name == "RUNNING" for t in study.get_trials())


def test_process_alive_sees_exit_zombies_and_reused_pids():
    proc = subprocess.Popen(["sleep", "30"])
    started = claims.process_start(proc.pid)
    assert claims.process_alive(proc.pid, started)
    assert not claims.process_alive(proc.pid, started + 1)  # the same pid, a later process: not ours
    proc.kill()
    time.sleep(0.2)
    assert not claims.process_alive(proc.pid, started)  # a zombie until reaped
    proc.wait()
    assert not claims.process_alive(proc.pid, started)


def sweep_file(tmp_path, points):
    lrs = [round(1e-3 + 1e-4 * i, 6) for i in range(points)]
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump({"base": "adam_mnist", "metric": "val_acc", "parameters": {"optim.lr": lrs}}))
    return path, lrs


QUICK = ["backend=cpu", "train.epochs=1", "model.hidden=[8]", "train.batch_size=5000", "data.val_size=1000",
         "train.eval_batch_size=10000"]


def race(tmp_path, data_dir, attempt, workers=4, points=40):
    """`workers` sweep commands at once on one study (the default journal file) of `points` quick trials, with two CPU hogs;
    returns (trial numbers each worker ran, the study's trials)."""
    path, lrs = sweep_file(tmp_path, points)
    name = f"race{attempt}"
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), *QUICK, "--runs-dir", str(tmp_path / "runs"),
               "--name", name]
    env = {**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    hogs = busy(2)
    try:
        procs = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for _ in range(workers)]
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        stop(hogs)
    assert [p.returncode for p in procs] == [0] * workers, outputs
    ran = [[int(m) for m in re.findall(r"^trial (\d+): optim\.lr=", out, re.M)] for out in outputs]
    trials = optuna.load_study(study_name=name, storage=journal(tmp_path / "runs" / name / "study.journal")).get_trials()
    return ran, trials, lrs


def test_four_sweep_processes_run_forty_trials_each_once(tmp_path, data_dir):
    repeats = int(os.environ.get("MLPTRAIN_SWEEP_RACE_REPEATS", "1"))  # the report runs it 5 times
    for attempt in range(repeats):
        start = time.perf_counter()
        ran, trials, lrs = race(tmp_path, data_dir, attempt)
        numbers = sorted(n for worker in ran for n in worker)
        print(f"attempt {attempt + 1}: trials per worker {[len(w) for w in ran]}, {len(numbers)} runs of "
              f"{len(set(numbers))} distinct trials, {len(trials)} trials in the study, states "
              f"{sorted({t.state.name for t in trials})}, {time.perf_counter() - start:.1f} s")
        assert numbers == list(range(len(lrs)))  # no trial ran twice, none was skipped
        assert len(trials) == len(lrs) and all(t.state.name == "COMPLETE" for t in trials)
        assert sorted(t.params["optim.lr"] for t in trials) == lrs
        folders = sorted(p.name for p in (tmp_path / "runs" / f"race{attempt}").glob("trial-*"))
        assert folders == [f"trial-{n:04d}" for n in range(len(lrs))]


def test_sigterm_stops_a_sweep_and_its_workers(tmp_path, data_dir):
    path, lrs = sweep_file(tmp_path, 4)
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), "backend=cpu", "train.epochs=200",
               "model.hidden=[8]", "train.batch_size=5000", "--runs-dir", str(tmp_path / "runs"), "--name", "t",
               "--workers", "2"]
    env = {**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    study_file = tmp_path / "runs" / "t" / "study.journal"
    deadline, pids = time.monotonic() + 120, set()
    while len(pids) < 2 and time.monotonic() < deadline:  # both workers have claimed a trial
        time.sleep(0.5)
        if study_file.exists():  # reading a journal takes no lock
            storage = journal(study_file)
            try:
                trials = storage.get_all_trials(storage.get_study_id_from_name("t"), deepcopy=False)
            except KeyError:  # not created yet
                continue
            pids = {t.system_attrs[claims.WORKER]["pid"] for t in trials if claims.WORKER in t.system_attrs}
    assert len(pids) == 2, parent.communicate(timeout=60)[0] if parent.poll() is not None else "no claims"
    time.sleep(2)  # training
    parent.send_signal(signal.SIGTERM)
    out = parent.communicate(timeout=90)[0]
    assert parent.returncode == 143, out
    assert "interrupted: re-run the same command" in out and "Traceback" not in out
    assert not any(Path(f"/proc/{pid}").exists() and claims.process_alive(pid, None) for pid in pids)  # no orphans
    trials = optuna.load_study(study_name="t", storage=journal(study_file)).get_trials()
    retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    stopped = {t.number for t in trials if claims.WORKER in t.system_attrs}
    assert not [t for t in trials if t.state.name == "RUNNING"] and stopped <= retried  # each queued again
    for log in (tmp_path / "runs" / "t").glob("worker-*.log"):
        assert "Traceback" not in log.read_text()


def test_a_heartbeat_due_as_the_trial_ends_says_nothing(tmp_path):
    """The heartbeat thread may beat just after its trial was told its outcome: in a journal that write is
    refused for a finished trial, and must not print the heartbeat's failure warning."""
    storage = journal(tmp_path / "study.journal")
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": 1})
    study_id = storage.get_study_id_from_name("s")
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, 0)
    assert claims.claim(storage, trial_id, claims.this_worker())
    claims.beat(storage, trial_id)
    assert claims.HEARTBEAT in storage.get_trial(trial_id).system_attrs
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.COMPLETE, [1.0])
    claims.beat(storage, trial_id)  # after the outcome: nothing raised
    assert claims.abandoned(storage, study_id, 0.0) == []
