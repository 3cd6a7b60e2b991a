"""Sweeps: what runs, what is recorded, what a re-run does, and how workers share a study.

Most tests run the command in-process on a small learnable stand-in for MNIST
(each class lights its own band of pixels), so a trial takes a fraction of a
second on the CPU; the two-worker test runs real processes on the real data.
"""

import itertools
import json
import os
import subprocess
import sys
import time

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
import pytest
import typer
import yaml

from mlptrain.cli.sweep import sweep
from mlptrain.config.builtins import builtin_configs, builtin_sweeps
from mlptrain.errors import UserError
from mlptrain.sweep import claims, engine
from mlptrain.sweep import study_trials as trial_claims
from mlptrain.sweep.study_trials import claim_next, requeue_stale
from mlptrain.sweep import study as studies
from mlptrain.sweep.spec import load_sweep
from mlptrain.training.experiment import Resources
from tests.cli.test_cli import REPO

FAST = ["backend=cpu", "train.epochs=1", "model.hidden=[16]", "data.val_size=100", "train.batch_size=100",
        "train.eval_batch_size=500"]


def write_sweep(tmp_path, parameters, **fields):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "adam_mnist", "metric": "val_acc", **fields, "parameters": parameters},
                                   sort_keys=False))
    return path


def run_sweep(path, runs_dir, overrides=(), name="s", fast=FAST, pack=1):
    sweep(str(path), [*fast, *overrides], runs_dir, name, None, 1, False, pack)
    return json.loads((runs_dir / name / "results.json").read_text())


def study_trials(sweep_dir):
    journal = sweep_dir / "study.journal"
    storage = JournalStorage(JournalFileBackend(str(journal))) if journal.exists() else \
        f"sqlite:///{sweep_dir / 'study.db'}"
    return optuna.load_study(study_name=sweep_dir.name, storage=storage).get_trials()


def location(kind: str, folder) -> str:
    """A study's storage in `folder`: the default journal file, or an SQLite database (which a sweep folder
    made by an earlier version holds, and which --storage may name)."""
    return str(folder / "study.journal") if kind == "journal" else f"sqlite:///{folder / 'study.db'}"


def test_grid_runs_exactly_its_product(tmp_path, tiny_mnist, trains):
    lrs, activations = [1e-3, 3e-3, 1e-2], ["relu", "tanh"]
    path = write_sweep(tmp_path, {"optim.lr": lrs, "model.activation": activations})
    results = run_sweep(path, tmp_path / "runs")
    points = [(t["params"]["optim.lr"], t["params"]["model.activation"]) for t in results["trials"]]
    assert sorted(points) == sorted(itertools.product(lrs, activations))
    assert len(trains) == 6 and len(study_trials(tmp_path / "runs" / "s")) == 6
    assert {(c.optim.lr, c.model.activation) for c in trains} == set(points)
    assert all(t["state"] == "complete" and t["value"] == t["metrics"]["val_acc"] for t in results["trials"])
    best = max(results["trials"], key=lambda t: t["value"])
    assert results["best"] == best["number"]
    for trial in results["trials"]:
        summary = json.loads((tmp_path / trial["run_dir"] / "summary.json").read_text())
        assert summary["val_acc"] == trial["value"]
    csv_lines = (tmp_path / "runs" / "s" / "results.csv").read_text().splitlines()
    assert csv_lines[0] == "number,state,val_acc,optim.lr,model.activation,run_dir,error" and len(csv_lines) == 7


def test_without_pruning_every_epochs_report_is_in_the_study_when_it_ends(tmp_path, tiny_mnist):
    """The reports of a sweep that does not prune are written behind the training (mlptrain.sweep.study_trials); the
    study holds each epoch's before it holds the trial's outcome."""
    path = write_sweep(tmp_path, {"optim.lr": [1e-3, 3e-3]})
    results = run_sweep(path, tmp_path / "runs", ["train.epochs=3"])
    for trial in study_trials(tmp_path / "runs" / "s"):
        assert trial.state == optuna.trial.TrialState.COMPLETE and sorted(trial.intermediate_values) == [1, 2, 3]
        curve = [json.loads(line)["val_acc"] for line in (tmp_path / trial.user_attrs["run_dir"] /
                                                          "metrics.jsonl").read_text().splitlines()
                 if "val_acc" in json.loads(line)]
        assert [trial.intermediate_values[epoch] for epoch in (1, 2, 3)] == curve[:3]
    assert all(t["state"] == "complete" for t in results["trials"])


def test_a_report_the_study_refuses_fails_its_trial(tmp_path, tiny_mnist, monkeypatch):
    """A report written behind the training that fails (the storage refused it) fails its trial with the
    storage's message, as when reports were written at once; the sweep goes on."""
    report = optuna.trial.Trial.report

    def refusing(self, value, step):
        if self.number == 0 and step == 2:
            raise OSError("journal: no space left on device")
        return report(self, value, step)

    monkeypatch.setattr(optuna.trial.Trial, "report", refusing)
    path = write_sweep(tmp_path, {"optim.lr": [1e-3, 3e-3]})
    results = run_sweep(path, tmp_path / "runs", ["train.epochs=2"])
    states = {t["number"]: (t["state"], t.get("error")) for t in results["trials"]}
    assert states[0] == ("failed", "OSError: journal: no space left on device") and states[1][0] == "complete"


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_a_failing_trial_is_recorded_and_the_others_complete(tmp_path, tiny_mnist):
    path = write_sweep(tmp_path, {"optim.lr": [1e-3, 1e12, 3e-3]})
    results = run_sweep(path, tmp_path / "runs", ["optim.name=sgd"])
    states = {t["params"]["optim.lr"]: t["state"] for t in results["trials"]}
    assert states == {1e-3: "complete", 1e12: "failed", 3e-3: "complete"}
    failed = next(t for t in results["trials"] if t["state"] == "failed")
    assert "optim.lr=1000000000000.0 is likely too high" in failed["error"] and failed["value"] is None


def test_an_invalid_combination_fails_only_its_trial(tmp_path, tiny_mnist):
    # cosine has no warmup: (cosine, 10) is rejected by the config, the three other points run
    path = write_sweep(tmp_path, {"schedule.name": ["cosine", "warmup_cosine"], "schedule.warmup_steps": [0, 10]})
    results = run_sweep(path, tmp_path / "runs")
    failed = [t for t in results["trials"] if t["state"] == "failed"]
    assert [t["params"] for t in failed] == [{"schedule.name": "cosine", "schedule.warmup_steps": 10}]
    assert "has no warmup" in failed[0]["error"] and failed[0]["run_dir"] is None
    assert sum(t["state"] == "complete" for t in results["trials"]) == 3


def test_resume_after_ctrl_c_runs_only_what_is_missing(tmp_path, tiny_mnist, trains, monkeypatch):
    real = engine.training

    def interrupted_third(session, *args, **kwargs):
        if len(trains) == 2:
            raise KeyboardInterrupt
        return (yield from real(session, *args, **kwargs))

    monkeypatch.setattr(engine, "training", interrupted_third)
    path = write_sweep(tmp_path, {"optim.lr": [1e-3, 2e-3, 3e-3, 4e-3]})
    with pytest.raises(typer.Exit):
        run_sweep(path, tmp_path / "runs")
    half = json.loads((tmp_path / "runs" / "s" / "results.json").read_text())
    assert [t["state"] for t in half["trials"]] == ["complete", "complete", "waiting", "waiting"]

    monkeypatch.setattr(engine, "training", real)
    results = run_sweep(path, tmp_path / "runs")
    assert sorted(c.optim.lr for c in trains[2:]) == [3e-3, 4e-3]
    assert sorted(t["params"]["optim.lr"] for t in results["trials"]) == [1e-3, 2e-3, 3e-3, 4e-3]
    assert all(t["state"] == "complete" for t in results["trials"])


def dead_worker(this_worker=claims.this_worker) -> dict:
    """The identity of a process of this machine that has exited."""
    proc = subprocess.Popen(["sleep", "30"])
    worker = {**this_worker(), "pid": proc.pid, "started": claims.process_start(proc.pid)}
    proc.kill()
    proc.wait()
    return worker


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_resume_reruns_a_trial_whose_worker_died(tmp_path, tiny_mnist, trains, monkeypatch, kind):
    """The re-run finds the sweep folder's study: its journal, or the study.db an earlier version made."""
    path = write_sweep(tmp_path, {"optim.lr": [1e-3, 3e-3]})
    spec = load_sweep(path, FAST)
    (tmp_path / "runs" / "s").mkdir(parents=True)
    study, storage = studies.open_study(spec, tmp_path / "runs" / "s", "s", location(kind, tmp_path / "runs" / "s"))
    with monkeypatch.context() as patch:
        patch.setattr(claims, "this_worker", dead_worker)  # the claim's worker is then gone
        trial, _ = claim_next(study, storage, storage.get_study_id_from_name("s"))
    assert trial.number == 0

    results = run_sweep(path, tmp_path / "runs")  # on this machine a dead pid is seen at once, no grace period
    assert sorted(c.optim.lr for c in trains) == [1e-3, 3e-3]
    assert [(t["number"], t["state"]) for t in results["trials"]] == [(1, "complete"), (2, "complete")]
    assert {t.number: t.state.name for t in study_trials(tmp_path / "runs" / "s")} == \
        {0: "FAIL", 1: "COMPLETE", 2: "COMPLETE"}


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_live_worker_here_keeps_its_trial_and_a_silent_one_elsewhere_loses_it(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(trial_claims, "GRACE_S", 1)
    spec = load_sweep(write_sweep(tmp_path, {"optim.lr": [1e-3, 2e-3]}), [])
    study, storage = studies.open_study(spec, tmp_path, "s", location(kind, tmp_path))
    study_id = storage.get_study_id_from_name("s")
    claim_next(study, storage, study_id)  # this process: alive, and it never beats again
    with monkeypatch.context() as patch:
        patch.setattr(claims, "this_worker", lambda: {"host": "elsewhere", "boot": "", "pid": 1, "started": None})
        claim_next(study, storage, study_id)  # a worker on another machine
    time.sleep(2.5)  # SQLite keeps heartbeats to the second: both heartbeats have lapsed
    requeue_stale(study, storage, study_id)
    here, elsewhere, retry = study.get_trials()
    assert here.state.name == "RUNNING"  # a starved worker on this machine is not taken for dead
    assert elsewhere.state.name == "FAIL" and retry.state.name == "WAITING"
    assert retry.user_attrs == {"retry_of": 1} and retry.system_attrs["fixed_params"] == {"optim.lr": 2e-3}


def test_a_worker_of_this_machines_sweep_exits_when_nothing_is_queued(tmp_path, monkeypatch):
    """A `--worker` child neither waits for trials running elsewhere (its parent watches them) nor creates
    or checks the study's tables: it loads the study its parent made, whose SQLite file is in WAL mode."""
    spec = load_sweep(write_sweep(tmp_path, {"optim.lr": [1e-3]}), [])
    url = f"sqlite:///{tmp_path}/study.db"
    study, storage = studies.open_study(spec, tmp_path, "s", url)
    with storage.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL: WAL syncs at checkpoints
    claim_next(study, storage, storage.get_study_id_from_name("s"))  # held by a live worker (this one)
    worker_study, worker_storage = studies.open_study(spec, tmp_path, "s", url, worker=True)
    monkeypatch.setattr(engine, "_run_trial", lambda *args: pytest.fail("nothing was queued"))
    started = time.monotonic()
    engine.work(worker_study, worker_storage, spec, tmp_path, Resources(), wait_for_others=False)
    assert time.monotonic() - started < engine.POLL_S
    assert [t.state.name for t in worker_study.get_trials()] == ["RUNNING"]


def test_a_trial_checkpoints_once_at_its_end_unless_its_config_says(tmp_path):
    """A trial never resumes (a re-run starts afresh): it writes `last` and `best` once, at its end."""
    path = write_sweep(tmp_path, {"optim.lr": [1e-3], "train.epochs": [2, 6]})
    spec = load_sweep(path, [])
    assert spec.trial_config({"optim.lr": 1e-3, "train.epochs": 6}, "t").train.checkpoint_every_epochs == 6
    assert spec.trial_config({"optim.lr": 1e-3, "train.epochs": 2}, "t").train.checkpoint_every_epochs == 2
    asked = load_sweep(path, ["train.checkpoint_every_epochs=1"])
    assert asked.trial_config({"optim.lr": 1e-3, "train.epochs": 6}, "t").train.checkpoint_every_epochs == 1


def test_random_and_tpe_run_their_trials_within_the_range(tmp_path, tiny_mnist):
    for method in ("random", "tpe"):
        path = write_sweep(tmp_path, {"optim.lr": {"low": 1e-4, "high": 1e-2, "log": True},
                                      "model.hidden": [[8], [16, 8]]}, method=method, trials=3)
        results = run_sweep(path, tmp_path / "runs", name=method, fast=[o for o in FAST if "hidden" not in o])
        assert len(results["trials"]) == 3 and all(t["state"] == "complete" for t in results["trials"])
        assert all(1e-4 <= t["params"]["optim.lr"] <= 1e-2 for t in results["trials"])
        assert all(t["params"]["model.hidden"] in ([8], [16, 8]) for t in results["trials"])


def test_pruning_stops_a_trial_below_the_median_and_logs_hparams(tmp_path, tiny_mnist, monkeypatch):
    monkeypatch.setattr(studies, "PRUNE_AFTER_TRIALS", 1)
    path = write_sweep(tmp_path, {"optim.lr": [1e-2, 1e-7]}, prune=True)
    results = run_sweep(path, tmp_path / "runs", ["train.epochs=3"])
    good, bad = results["trials"]
    assert good["state"] == "complete" and bad["state"] == "pruned"
    records = (tmp_path / bad["run_dir"] / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 1 and bad["value"] == json.loads(records[0])["val_acc"]

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    for trial in (good, bad):  # the finished run logs its own session; the sweep writes the pruned one's
        run_dir = tmp_path / trial["run_dir"]
        assert not (run_dir / "hparams").exists()  # in the run's own directory: one run in TensorBoard, not two
        values = [v for events in run_dir.glob("events.out.tfevents.*")
                  for e in EventFileLoader(str(events)).Load() for v in e.summary.value]
        start = next(v for v in values if v.tag == "_hparams_/session_start_info")
        data = HParamsPluginData.FromString(start.metadata.plugin_data.content)
        assert data.session_start_info.hparams["optim.lr"].number_value == trial["params"]["optim.lr"]
        assert data.session_start_info.hparams["backend"].string_value == "cpu"  # resolved, as in config.yaml
        assert not any(v.tag.startswith("hparam/") for v in values)  # the metrics are the run's own val/ scalars
        assert any(v.tag == "accuracy/val" for v in values), sorted({v.tag for v in values})


def test_every_mistake_of_a_sweep_file_is_named_in_one_line(tmp_path):
    """A file with several mistakes names them all at once, not one per run."""
    raw = {"base": "adam_mnist", "metrik": "val_acc", "method": "bayes", "prune": "asha",
           "parameters": {"optim.lrr": [1e-3], "optim.lr": [-1], "train.epochs": [1, 1]}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError) as err:
        load_sweep(path, [])
    message = str(err.value)
    assert "\n" not in message and f"{path}: 5 problems: " in message, message
    for fragment in ("unknown key 'metrik'; did you mean 'metric'?", "method: 'bayes' is not one of",
                     "prune: expected true, false or one of", "unknown key 'optim.lrr'", "distinct values"):
        assert fragment in message, fragment
    assert "'metric' is missing" not in message  # the misspelt key says it already
    # values are checked against the config once the file itself is sound: every parameter's bad value at once
    path.write_text(yaml.safe_dump({"base": "adam_mnist", "metric": "val_acc",
                                    "parameters": {"optim.lr": [1e-3, -1], "train.epochs": [0, 2]}}))
    with pytest.raises(UserError) as err:
        load_sweep(path, [])
    assert f"{path}: 2 problems: " in str(err.value) and "optim.lr: must be > 0" in str(err.value)
    assert "train.epochs" in str(err.value).split("; ")[-1]


@pytest.mark.parametrize("prune, pruner", [(True, "MedianPruner"), ("median", "MedianPruner"),
                                           ("successive_halving", "SuccessiveHalvingPruner"),
                                           ("hyperband", "HyperbandPruner"), (False, "NopPruner")])
def test_each_prune_setting_gives_optunas_pruner(tmp_path, prune, pruner):
    spec = load_sweep(write_sweep(tmp_path, {"optim.lr": [1e-3]}, prune=prune), [])
    study, _ = studies.open_study(spec, tmp_path, "s", str(tmp_path / "study.journal"))
    assert type(study.pruner).__name__ == pruner


def test_successive_halving_prunes_a_trial_and_says_by_which_rule(tmp_path, tiny_mnist, capsys):
    """Four trials, two hopeless: successive halving (its rungs at epochs 1, 4, ...) stops at least one of
    them after its first epoch, and the line names the rule, not the median's."""
    path = write_sweep(tmp_path, {"optim.lr": [1e-2, 3e-3, 1e-7, 2e-7]}, prune="successive_halving")
    results = run_sweep(path, tmp_path / "runs", ["train.epochs=2"])
    states = {t["params"]["optim.lr"]: t["state"] for t in results["trials"]}
    assert states[1e-2] == "complete" and "pruned" in (states[1e-7], states[2e-7]), states
    said = capsys.readouterr()
    assert "is not among the best at its rung (successive halving)" in " ".join((said.out + said.err).split())


def test_a_changed_sweep_is_not_continued_and_what_changed_is_named(tmp_path, tiny_mnist):
    run_sweep(write_sweep(tmp_path, {"optim.lr": [1e-3]}), tmp_path / "runs")
    with pytest.raises(UserError, match=r"started with a different trials, parameters \(parameters.optim.lr.choices: "
                                        r"\[0.001\] then, \[0.001, 0.01\] now; trials: 1 then, 2 now\)"):
        run_sweep(write_sweep(tmp_path, {"optim.lr": [1e-3, 1e-2]}), tmp_path / "runs")
    with pytest.raises(UserError, match=r"started with a different base \(base.train.epochs: 1 then, 2 now\); "
                                        "re-run it unchanged"):  # only an override changed
        run_sweep(write_sweep(tmp_path, {"optim.lr": [1e-3]}), tmp_path / "runs", overrides=["train.epochs=2"])


@pytest.mark.parametrize("fields, fragment", [
    ({"metrik": "val_acc"}, "unknown key 'metrik'; did you mean 'metric'?"),
    ({"metric": "val_accuracy"}, "'val_accuracy' is not one of"),
    ({"base": "nowhere.yaml"}, "base: 'nowhere.yaml' is neither a file"),
    ({"method": "bayes"}, "method: 'bayes' is not one of grid, random, tpe"),
    ({"method": "random"}, "trials: method random needs the number of trials"),
    ({"parameters": {"optim.lrr": [1e-3]}}, "unknown key 'optim.lrr'; did you mean 'optim.lr'?"),
    ({"parameters": {"optim.lr": [1e-3, -1]}}, "optim.lr: must be > 0"),
    ({"parameters": {"optim.lr": {"low": 1e-3, "high": 1e-2}}}, "a grid needs a list of values, not a range"),
    ({"method": "tpe", "trials": 4, "parameters": {"optim.lr": {"low": 1e-2, "high": 1e-3}}}, "must be below high"),
    ({"method": "tpe", "trials": 4, "parameters": {"optim.lr": {"low": 0, "high": 1, "log": True}}}, "log range"),
    ({"method": "tpe", "trials": 4, "parameters": {"optim.name": {"low": 0, "high": 1}}}, "needs a numeric key"),
    ({"parameters": {"train.epochs": [1, 1]}}, "distinct values"),
    ({"prune": True, "metric": "wall_s"}, "pruning needs a metric of every evaluation"),
    ({"prune": "asha"}, "prune: expected true, false or one of Optuna's pruners median, successive_halving, hyperband"),
    ({"prune": "hyperband", "metric": "wall_s"}, "pruning needs a metric of every evaluation"),
    ({"prune": True, "metric": "test_acc"}, "test_acc is evaluated only at the end of a run (train.eval_test: end)"),
    ({"prune": True, "metric": "test_loss", "parameters": {"train.eval_test": ["every_epoch", "end"]}},
     "test_loss is evaluated only at the end of a run"),
])
def test_bad_sweep_files_are_one_clear_line(tmp_path, fields, fragment):
    raw = {"base": "adam_mnist", "metric": "val_acc", "parameters": {"optim.lr": [1e-3]}, **fields}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=None) as err:
        load_sweep(path, [])
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_test_metric_prunes_when_the_test_split_is_evaluated_every_epoch(tmp_path):
    path = write_sweep(tmp_path, {"optim.lr": [1e-3]}, metric="test_acc", prune=True)
    assert load_sweep(path, ["train.eval_test=every_epoch"]).prune


def test_an_override_of_a_varied_key_is_refused(tmp_path):
    path = write_sweep(tmp_path, {"optim.lr": [1e-3]})
    with pytest.raises(UserError, match="varies optim.lr"):
        load_sweep(path, ["optim.lr=0.1"])


def test_the_builtin_sweep_is_valid_and_not_a_config():
    assert "sweep_lr_mnist" in builtin_sweeps() and "sweep_lr_mnist" not in builtin_configs()
    spec = load_sweep(builtin_sweeps()["sweep_lr_mnist"], [])
    assert spec.method == "grid" and spec.trials == len(spec.grid()) >= 3


def test_two_workers_share_one_study(tmp_path, data_dir):
    """Two processes run the same command at once: between them they finish the grid, each point once."""
    lrs = [1e-3, 2e-3, 3e-3, 4e-3]
    path = write_sweep(tmp_path, {"optim.lr": lrs})
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), "backend=cpu", "train.epochs=1",
               "model.hidden=[16]", "train.batch_size=1000", "data.val_size=1000", "train.eval_batch_size=5000",
               "--runs-dir", str(tmp_path / "runs"), "--name", "shared"]
    env = {**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)}
    workers = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    results = json.loads((tmp_path / "runs" / "shared" / "results.json").read_text())
    assert sorted(t["params"]["optim.lr"] for t in results["trials"]) == lrs
    assert all(t["state"] == "complete" for t in results["trials"])
    assert len(study_trials(tmp_path / "runs" / "shared")) == len(lrs)
    ran = [sorted(int(line.split()[1].rstrip(":")) for line in out.splitlines() if line.startswith("trial ")
                  and "optim.lr=" in line) for out in outputs]
    assert sorted(ran[0] + ran[1]) == list(range(len(lrs))), ran
    assert len(list((tmp_path / "runs" / "shared").glob("trial-*/summary.json"))) == len(lrs)
