"""`logging.mlflow`: a run's params, metrics and artefacts in MLflow as well, beside TensorBoard.

The run's MLflow run is created before training and its id kept in the run folder (mlflow.json), so a
resumed run goes on logging to the same MLflow run. Params are the run's hyperparameters (the keys
HParams shows); metrics carry TensorBoard's tags (`accuracy/val`, `loss/train`, `opt/lr`, ...) and
steps, buffered and sent once per evaluation; the artefacts (config.yaml, summary.json, metrics.csv,
the gradient norms and the checkpoint a run reports) are sent when the run ends, which also sets the
MLflow run's status (FINISHED, KILLED on an interruption, FAILED on an error).

Where: `logging.mlflow_uri`, else $MLFLOW_TRACKING_URI, else a local store beside the runs, SQLite in
RUNS/mlflow.db with artefacts in RUNS/mlruns/ (MLflow 3 keeps a plain ./mlruns folder only as a store in
maintenance mode, which it refuses unless told otherwise; `mlflow ui --backend-store-uri
sqlite:///RUNS/mlflow.db` shows it). A store that cannot be reached or written stops the run before it
trains, in one line; one that fails later stops the MLflow logging only, with one warning line that
summary.json records among its fallbacks: the run, TensorBoard and metrics.jsonl go on.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

from rich.markup import escape

from mlptrain.errors import TrainingInterrupted, UserError
from mlptrain.util.atomic import write_text
from mlptrain.util.console import console, warn
from mlptrain.util.regular_file import read_regular_text

RECORD = "mlflow.json"  # in the run folder: which MLflow run it logs to
ARTEFACTS = ("config.yaml", "summary.json", "metrics.csv", "grad_norms.npy")
# an unreachable tracking server fails in seconds, not after MLflow's default 7 retries of 120 s each
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
PARAMS_PER_CALL, METRICS_PER_CALL = 100, 1000  # MLflow's limits on one log_batch


def default_uri(runs_dir: Path) -> str:
    return f"sqlite:///{(runs_dir / 'mlflow.db').resolve()}"


class MlflowLog:
    """One MLflow run of an mlptrain run: `add` buffers scalars, `flush` sends them, `finish` ends it."""

    def __init__(self, client, run_id: str, where: str, on_failure=None):
        self.client, self.run_id, self.where, self.on_failure = client, run_id, where, on_failure
        self.pending = []
        self.failure: str | None = None  # the warning line once a call failed (logging to MLflow then stops)
        self.caller_stopped = False  # the run's on_evaluation stopped it (a sweep pruned the trial)

    @classmethod
    def start(cls, run_dir: Path, settings, params: dict, on_failure=None) -> MlflowLog:
        """Open the MLflow run of `run_dir` (the one mlflow.json names, else a new one with `params`); raises
        UserError in one line when MLflow is missing or its store cannot be used. `on_failure(line)` is
        called once if a later call fails (the run records the line among its fallbacks)."""
        client, uri, name, experiment = connect(settings, run_dir.parent)
        from mlflow.entities import Param  # connect() has found MLflow installed

        try:
            run_id = _continued_run(client, run_dir, uri)
            if run_id is None:
                run = client.create_run(experiment, run_name=run_dir.name,
                                        tags={"mlptrain.run_dir": str(run_dir.resolve())})
                run_id = run.info.run_id
                items = [Param(key, _param_text(value)) for key, value in params.items()]
                for i in range(0, len(items), PARAMS_PER_CALL):
                    client.log_batch(run_id, params=items[i:i + PARAMS_PER_CALL])
                write_text(run_dir / RECORD, json.dumps({"tracking_uri": uri, "experiment": name,
                                                         "run_id": run_id}, indent=2) + "\n")
        except Exception as err:  # MLflow's own errors, a driver's, a full disk: the store cannot be used
            raise UserError(f"logging.mlflow: cannot log to {uri}: {_one_line(err)}") from None
        console.print(escape(f"MLflow: run {run_id} in experiment {name!r} at {uri}"), highlight=False)
        return cls(client, run_id, uri, on_failure)

    def watching(self, on_evaluation):
        """`on_evaluation` (or None), noting when it stops the run: the MLflow run then ends KILLED, not FAILED."""
        if on_evaluation is None:
            return None

        def watched(record: dict) -> None:
            try:
                on_evaluation(record)
            except BaseException:
                self.caller_stopped = True
                raise
        return watched

    @contextmanager
    def ending(self, run_dir: Path):
        """The run's training inside; then `finish` with FINISHED, KILLED (Ctrl-C, a signal, or stopped by
        its caller) or FAILED (an error), and whatever ended it raised again."""
        try:
            yield
        except BaseException as err:
            stopped = self.caller_stopped or isinstance(err, (KeyboardInterrupt, TrainingInterrupted))
            self.finish(run_dir, "KILLED" if stopped else "FAILED")
            raise
        self.finish(run_dir, "FINISHED")

    def add(self, step: int, values: dict) -> None:
        """Scalars as TensorBoard gets them (tag: value at step), sent at the next flush."""
        now = int(time.time() * 1000)
        self.pending += [(tag, float(value), now, int(step)) for tag, value in values.items()]

    def flush(self) -> None:
        if self.failure is not None or not self.pending:
            self.pending = []
            return
        # imported on first use: only runs with logging.mlflow import MLflow (a second)
        from mlflow.entities import Metric

        metrics = [Metric(tag, value, stamp, step) for tag, value, stamp, step in self.pending]
        self.pending = []
        self._call(lambda: [self.client.log_batch(self.run_id, metrics=metrics[i:i + METRICS_PER_CALL])
                            for i in range(0, len(metrics), METRICS_PER_CALL)])

    def finish(self, run_dir: Path, status: str) -> None:
        """Send what is pending and the run folder's artefacts, then end the MLflow run with `status`
        (FINISHED, KILLED or FAILED). Never raises: a failure is one warning line."""
        self.flush()
        for name in ARTEFACTS:
            if (run_dir / name).is_file():
                self._call(lambda name=name: self.client.log_artifact(self.run_id, str(run_dir / name)))
        for kept in ("best", "last"):  # the checkpoint the run reports: best when it has one
            path = run_dir / "checkpoints" / f"{kept}.npz"
            if path.is_file():
                self._call(lambda: self.client.log_artifact(self.run_id, str(path), "checkpoints"))
                break
        self._call(lambda: self.client.set_terminated(self.run_id, status))

    def _call(self, send) -> None:
        if self.failure is not None:
            return
        try:
            send()
        except Exception as err:  # the store went away mid-run: the run goes on without it
            self.failure = (f"MLflow: logging to {self.where} failed ({_one_line(err)}); the run goes on with "
                            "TensorBoard and metrics.jsonl only")
            warn(escape(self.failure))
            if self.on_failure is not None:
                self.on_failure(self.failure)


def connect(settings, runs_dir: Path):
    """(client, tracking URI, experiment name, experiment id) for runs in `runs_dir` with `settings` (the
    config's logging section), the experiment created when missing; raises UserError in one line when
    MLflow is not installed or its store cannot be reached or written."""
    try:
        # an optional extra (mlptrain[mlflow]), imported only when logging.mlflow is on
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise UserError("logging.mlflow: MLflow is not installed here; pip install 'mlptrain[mlflow]', or set "
                        "logging.mlflow=false") from None
    for name in ("mlflow", "alembic"):  # their INFO lines (creating tables, experiments) are not the run's
        logging.getLogger(name).setLevel(logging.WARNING)
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    local = not settings.mlflow_uri and not os.environ.get("MLFLOW_TRACKING_URI")
    uri = default_uri(runs_dir) if local else settings.mlflow_uri or os.environ["MLFLOW_TRACKING_URI"]
    name = settings.mlflow_experiment or runs_dir.resolve().name
    try:
        if local:
            runs_dir.mkdir(parents=True, exist_ok=True)  # the store's folder: `runs` before its first run
        client = MlflowClient(tracking_uri=uri)
        experiment = _experiment(client, name, _artefact_folder(uri, runs_dir))
    except Exception as err:  # MLflow's own errors, a driver's, a full disk: the store cannot be used
        raise UserError(f"logging.mlflow: cannot log to {uri}: {_one_line(err)}") from None
    return client, uri, name, experiment


def _artefact_folder(uri: str, runs_dir: Path) -> str | None:
    """Where a new experiment keeps its artefacts: a tracking server decides for itself (None); with a
    database the client writes them, and MLflow's default, ./mlruns, is wherever the command was started:
    RUNS/mlruns instead, beside the runs (RUNS/mlflow.db's own folder for the default store)."""
    if uri.split(":", 1)[0] in ("http", "https", "databricks", "databricks-uc", "uc"):
        return None
    return (runs_dir / "mlruns").resolve().as_uri()


def _experiment(client, name: str, artifact_location: str | None) -> str:
    """The id of experiment `name`, created when missing (by whichever of several workers gets there first)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except Exception:  # another worker created it meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _continued_run(client, run_dir: Path, uri: str) -> str | None:
    """The id of the MLflow run this run folder logged to at `uri` (a resumed run), marked running again; None
    for a new run, another store, or a record that names no run there."""
    try:
        record = json.loads(read_regular_text(run_dir / RECORD, follow=False))  # a link is no record of this run
    except (OSError, ValueError, RecursionError):  # missing, a link, damaged
        return None
    run_id = record.get("run_id") if isinstance(record, dict) and record.get("tracking_uri") == uri else None
    if not isinstance(run_id, str):
        return None
    try:
        client.get_run(run_id)
    except Exception:  # deleted from the store since: a new run
        return None
    client.update_run(run_id, status="RUNNING")
    return run_id


def _param_text(value) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 6000 else text[:5997] + "..."  # MLflow's longest param value


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."

