"""logging.mlflow: a run's params, metrics and artefacts in MLflow, read back through MLflow's own client;
a resumed run continues its MLflow run; a store that cannot be used is one line before anything is
written; one that fails mid-run stops only the MLflow logging, recorded as a fallback (CPU backend, tiny
synthetic data)."""

import contextlib
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import under_ci

try:
    from mlflow.tracking import MlflowClient
except ImportError:  # the dev extra brings MLflow; CI installs it, so there its absence is a failure
    if under_ci():
        raise
    pytest.skip("MLflow is not installed (pip install -e '.[dev]' brings it)", allow_module_level=True)

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import config_from_dict, config_to_dict
from mlptrain.errors import TrainingInterrupted, UserError
from mlptrain.run_dirs.lock import release_run
from mlptrain.run_dirs.mlflow_log import MlflowLog, connect, default_uri
from mlptrain.training.experiment import create_run, data_root
from mlptrain.training.hparams import hparam_values
from mlptrain.training.loop import train
from mlptrain.training.resume import prepare_resume
from mlptrain.training.session import build_session
from tests.cli.test_cli import assert_clean_failure, mlptrain
from tests.training.test_accumulation import make_config, synthetic_dataset


def mlflow_config(epochs=2, **logging):
    values = config_to_dict(make_config(64, 1, epochs=epochs))
    values["logging"] = {"mlflow": True, **logging}
    return config_from_dict(values)


def trained(runs, config, name="run"):
    run_dir = create_run(config, runs, name, "run")
    summary = train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir)
    release_run(run_dir)
    return run_dir, summary


def recorded_run(run_dir):
    record = json.loads((run_dir / "mlflow.json").read_text())
    client = MlflowClient(record["tracking_uri"])
    return client, client.get_run(record["run_id"])


def test_a_run_logs_its_params_metrics_and_artefacts_to_a_store_beside_the_runs(tmp_path):
    runs = tmp_path / "runs"
    config = mlflow_config()
    run_dir, summary = trained(runs, config)
    client, run = recorded_run(run_dir)
    assert client.tracking_uri == default_uri(runs) and (runs / "mlflow.db").is_file()
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert client.get_experiment(run.info.experiment_id).name == "runs"  # the runs folder's name
    # the params are HParams' keys, the logging section left out: where a run logs is no hyperparameter
    assert run.data.params == {key: str(value) for key, value in hparam_values(config, "cpu", data_root(config)).items()}
    assert not any(key.startswith("logging.") for key in run.data.params)
    assert run.data.params["optim.lr"] == "0.05" and run.data.params["seed"] == "3"
    history = client.get_metric_history(run.info.run_id, "accuracy/val")  # TensorBoard's tag and steps
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m.step, m.value) for m in history] == [(r["step"], pytest.approx(r["val_acc"])) for r in records]
    assert {"loss/train", "loss/val", "accuracy/test", "opt/lr"} <= set(run.data.metrics)
    artefacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "summary.json", "metrics.csv", "grad_norms.npy", "checkpoints"} <= artefacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")] == ["checkpoints/best.npz"]
    assert (runs / "mlruns").is_dir() and summary["fallbacks"] == []


def test_a_resumed_run_goes_on_in_the_same_mlflow_run(tmp_path):
    runs = tmp_path / "runs"
    run_dir, _ = trained(runs, mlflow_config(epochs=1))
    first = recorded_run(run_dir)[1].info.run_id
    config, start = prepare_resume(run_dir, ["train.epochs=2"])
    train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir, resume=start)
    client, run = recorded_run(run_dir)
    assert run.info.run_id == first and run.info.status == "FINISHED"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m.step for m in client.get_metric_history(first, "accuracy/val")] == steps and len(steps) == 2
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_the_experiment_and_store_can_be_named(tmp_path):
    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    run_dir, _ = trained(tmp_path / "runs", mlflow_config(mlflow_uri=uri, mlflow_experiment="mnist study"))
    client, run = recorded_run(run_dir)
    assert client.tracking_uri == uri and client.get_experiment(run.info.experiment_id).name == "mnist study"
    assert not (tmp_path / "runs" / "mlflow.db").exists()
    # a database's artefacts beside the runs, not in ./mlruns wherever the command was started
    assert client.get_experiment(run.info.experiment_id).artifact_location == (tmp_path / "runs" / "mlruns").as_uri()
    assert (tmp_path / "runs" / "mlruns").is_dir() and not (Path.cwd() / "mlruns").exists()


def test_without_mlflow_installed_the_refusal_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(UserError, match=r"pip install 'mlptrain\[mlflow\]'"):
        create_run(mlflow_config(), tmp_path / "runs", "run", "run")
    assert not (tmp_path / "runs" / "run").exists()  # refused before the run's folder


def test_a_store_that_cannot_be_used_is_one_line_and_leaves_no_run_folder(tmp_path, data_dir):
    result = mlptrain("run", "adam_mnist", "backend=cpu", "model.hidden=[8]", "train.epochs=1", "logging.mlflow=true",
                      "logging.mlflow_uri=nosuch://store", "--runs-dir", str(tmp_path / "runs"), "--name", "r",
                      cwd=tmp_path, env={"MLPTRAIN_DATA_DIR": str(data_dir)})
    assert_clean_failure(result, "logging.mlflow: cannot log to nosuch://store")
    assert not (tmp_path / "runs" / "r").exists()


class Failing:
    """An MLflow client whose calls fail after `good` of them (the store went away mid-run)."""

    def __init__(self, good=0):
        self.good, self.calls, self.statuses = good, [], []

    def log_batch(self, run_id, metrics=(), params=()):
        self._call("log_batch")

    def log_artifact(self, run_id, path, folder=None):
        self._call("log_artifact")

    def set_terminated(self, run_id, status):
        self._call("set_terminated")
        self.statuses.append(status)

    def _call(self, name):
        self.calls.append(name)
        if len(self.calls) > self.good:
            raise ConnectionError("the tracking server closed the connection")


def test_a_store_failing_mid_run_stops_only_the_mlflow_logging_once(tmp_path):
    noted = []
    log = MlflowLog(Failing(), "id", "http://tracking", on_failure=noted.append)
    log.add(10, {"loss/train": 0.5})
    log.flush()
    log.add(20, {"loss/train": 0.4})
    log.flush()
    log.finish(tmp_path, "FINISHED")
    assert log.client.calls == ["log_batch"]  # nothing more is tried once the store has failed
    assert noted == [log.failure] and "the tracking server closed the connection" in log.failure


@pytest.mark.parametrize("raised, caller, status", [
    (None, False, "FINISHED"), (ValueError("diverged"), False, "FAILED"),
    (TrainingInterrupted("stopped", 15), False, "KILLED"), (KeyboardInterrupt(), False, "KILLED"),
    (RuntimeError("pruned"), True, "KILLED"),  # a sweep's pruning, raised by the run's on_evaluation
])
def test_the_mlflow_run_ends_with_the_status_of_how_the_run_ended(tmp_path, raised, caller, status):
    log = MlflowLog(Failing(good=100), "id", "http://tracking")

    def on_evaluation(record):
        if raised is not None and caller:
            raise raised

    with pytest.raises(type(raised)) if raised is not None else contextlib.nullcontext():
        with log.ending(tmp_path):
            log.watching(on_evaluation)({})
            if raised is not None and not caller:
                raise raised
    assert log.client.statuses == [status]


def test_connect_makes_the_local_store_once_for_every_worker(tmp_path):
    settings = mlflow_config().logging
    first = connect(settings, tmp_path / "sweep")
    second = connect(settings, tmp_path / "sweep")
    assert first[1:] == second[1:] and first[2] == "sweep"


@pytest.mark.parametrize("record", ["[1, 2]", "{", '{"tracking_uri": 3}', '"text"', '{"run_id": "nosuchrun"}'])
def test_a_damaged_record_starts_a_new_mlflow_run(tmp_path, record):
    runs = tmp_path / "runs"
    run_dir, _ = trained(runs, mlflow_config(epochs=1))
    first = recorded_run(run_dir)[1].info.run_id
    (run_dir / "mlflow.json").write_text(record)
    config, start = prepare_resume(run_dir, ["train.epochs=2"])
    train(build_session(config, CpuBackend(), synthetic_dataset()), run_dir, resume=start)
    client, run = recorded_run(run_dir)
    assert run.info.run_id != first and run.info.status == "FINISHED"


def test_a_linked_record_is_refused_like_every_link_in_a_run(tmp_path):
    run_dir, _ = trained(tmp_path / "runs", mlflow_config(epochs=1))
    elsewhere = tmp_path / "other.json"
    (run_dir / "mlflow.json").rename(elsewhere)
    (run_dir / "mlflow.json").symlink_to(elsewhere)
    with pytest.raises(UserError, match="mlflow.json: a symbolic link"):
        prepare_resume(run_dir, ["train.epochs=2"])
