"""One experiment: a validated config, the backend and data it needs, and its run directory.

`mlptrain run` trains one experiment; a sweep trains many in one process, so
`Resources` keeps each backend and dataset once and the trials share them (and,
on the GPU, numba's compiled kernels with them).
"""

from __future__ import annotations

import os
import shutil
import threading
from contextlib import contextmanager, suppress
from pathlib import Path

from mlptrain.backends.cuda import ResidentCopies, driver_unusable_reason
from mlptrain.backends.driver.early import make_context_early
from mlptrain.backends.selection import get_backend
from mlptrain.config.load import RESOLVED, read_yaml, resolved_dict
from mlptrain.config.rules import check_validation
from mlptrain.config.schema import Config
from mlptrain.data import dataset_record, default_data_root, load_dataset
from mlptrain.data.loader import check_trainable, check_val_size
from mlptrain.errors import OutputClosed, TrainingDiverged, TrainingInterrupted, UserError
from mlptrain.nn import check_model_input
from mlptrain.run_dirs.event_files import import_tensorboardx
from mlptrain.run_dirs.folders import create_run_dir, write_yaml
from mlptrain.run_dirs.lock import LOCK_NAME, lock_run, release_run
from mlptrain.training.session import Session, build_session
from mlptrain.util.host_memory import is_out_of_memory, out_of_memory
from mlptrain.util.user_paths import expand_user


class Resources:
    """Backends by name and datasets by their data section, loaded on first use.

    A sweep that trains several trials at once gives each thread a view (`on_gpu`): its own backends, made
    on its GPU with a stream of their own, and the datasets shared (loaded once, on the host)."""

    def __init__(self, device: int | None = None, own_stream: bool = False, shared: dict | None = None):
        self._backends = {}
        self._gpu = (device, own_stream)
        # the datasets, a lock for loading them, one lock per GPU for building sessions, and per GPU the
        # datasets' copies there
        self._shared = shared if shared is not None else {"datasets": {}, "loading": threading.Lock(),
                                                          "gpus": {}, "gpus_lock": threading.Lock(), "resident": {}}
        self._datasets = self._shared["datasets"]

    def on_gpu(self, device: int, own_stream: bool = True) -> "Resources":
        """A view for a thread training on `device` (numba's index among the visible GPUs): the same datasets,
        backends of its own."""
        return Resources(device, own_stream, self._shared)

    def _resident_copies(self):
        """The device copies of the datasets that every view on this one's GPU shares (cuda.ResidentCopies):
        each dataset is put on a GPU once, not once per packed trial or worker thread."""
        with self._shared["gpus_lock"]:
            copies = self._shared["resident"]
            if self._gpu[0] not in copies:
                copies[self._gpu[0]] = ResidentCopies()
            return copies[self._gpu[0]]

    def with_own_stream(self) -> "Resources":
        """Another view on this one's GPU, with backends of its own on a stream of their own: a run trained
        beside others from the same thread (mlptrain.packing.side_by_side)."""
        return Resources(self._gpu[0], True, self._shared)

    @contextmanager
    def allocating(self):
        """Held while a session is built: trials of one GPU allocate (and numba frees what ended trials
        left, which its allocator does on an allocation, not from several threads at once) one at a time,
        and each checks the memory free before its own allocations, not during another's."""
        with self._shared["gpus_lock"]:
            lock = self._shared["gpus"].setdefault(self._gpu[0], threading.Lock())
        with lock:
            yield

    def dataset(self, config: Config):
        """The config's dataset, checked against data.val_size and the model; raises UserError."""
        data = config.data
        key = (data.dataset, data.root, data.path, data.label, data.image_size)
        with self._shared["loading"]:
            if key not in self._datasets:
                root = Path(data.root) if data.root else None
                self._datasets[key] = load_dataset(data.dataset, root, data.path, data.label, data.image_size)
        check_val_size(self._datasets[key], data.val_size)
        check_validation(config, "config", self._datasets[key].has_val_split)
        check_model_input(config.model, self._datasets[key])
        return self._datasets[key]

    def prepare(self, config: Config, start_compilers: bool = False, logs: bool | None = None):
        """(backend, dataset) for `config`; raises UserError. start_compilers: on a GPU with no compiled
        kernels yet, start the compile workers before loading the data (a run that will train). logs (default:
        start_compilers): the run will write TensorBoard events, so tensorboardX is imported while the GPU's
        context is made."""
        if config.backend not in self._backends:
            if (start_compilers if logs is None else logs) and config.backend != "cpu":
                make_context_early(self._gpu[0])  # the GPU's context made from now on, in a thread of its own
                import_tensorboardx()  # tensorboardX, which the run's event file imports anyway, meanwhile (0.1 s)
                # the kernel cache's key of this package, which the first session's kernel lookup needs: a GPU run's
                from mlptrain.backends.kernel_cache.cubins import fingerprint_early

                fingerprint_early()
            self._backends[config.backend] = get_backend(config.backend, *self._gpu, resident=self._resident_copies())
            if start_compilers:
                self._backends[config.backend].start_compilers()
        return self._backends[config.backend], self.dataset(config)


    def session(self, config: Config, start_compilers: bool = False) -> Session:
        """`config`'s session on its backend (`prepare`); raises UserError (mlptrain.training.session)."""
        return build_session(config, *self.prepare(config, start_compilers))


def check_inputs(config: Config, resources: Resources | None = None, ask_driver: bool = True) -> None:
    """What `Resources.prepare` refuses, found before a sweep starts its workers and without a GPU context:
    the dataset (loaded into `resources`, which keep it) and, for backend cuda (`ask_driver`), a driver with
    no GPU (the driver library answers in milliseconds; numba's own checks come when the backend is made)."""
    if ask_driver and config.backend == "cuda" and driver_unusable_reason() is not None:
        get_backend("cuda")  # raises its one-line reason
    check_trainable((resources or Resources()).dataset(config))


def create_run(config: Config, runs_dir: Path, name: str | None, stem: str, suffix_on_clash: bool = False,
               dataset=None, backend: str | None = None) -> Path:
    """The new run directory, locked for this process and holding the resolved config (see
    `create_run_dir` for the name) and, given the dataset, what the run read (`run_config`). With
    logging.mlflow, MLflow's store is checked first: a refusal leaves no folder behind."""
    if config.logging.mlflow:
        # imported on first use: only runs that log to MLflow need it
        from mlptrain.run_dirs.mlflow_log import connect

        connect(config.logging, runs_dir)
    run_dir = create_run_dir(runs_dir, name, stem, suffix_on_clash)
    try:
        lock_run(run_dir, "the run")  # held while this process works in it
        write_yaml(run_dir / "config.yaml", run_config(config, dataset, backend))
    except BaseException:  # a full disk or Ctrl-C here: no run folder holding only its lock is left behind
        discard_run(run_dir)
        raise
    return run_dir


def discard_run(run_dir: Path) -> None:
    """Remove a run folder this process made and holds, lock last (another process waiting for the name
    finds either the whole folder or none)."""
    for entry in list(run_dir.iterdir()) if run_dir.is_dir() else ():
        with suppress(OSError):  # a link is removed, never followed
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.name != LOCK_NAME:
                entry.unlink()
    release_run(run_dir)
    with suppress(OSError):
        (run_dir / LOCK_NAME).unlink(missing_ok=True)
        run_dir.rmdir()


@contextmanager
def whole_or_removed(run_dir: Path, new: bool):
    """Around training `run_dir`: when it ends for want of memory or of a reader (a closed stdout/stderr),
    a new run that has no checkpoint yet is removed (nothing in it could be resumed or evaluated, and it
    would take the name); one that has a checkpoint, or a resumed one, keeps it. An allocation that failed
    becomes the one-line refusal. So is a new run refused before its first record (too little disk for its
    checkpoints, a metrics.jsonl it cannot write): its folder would hold only config.yaml. A run that
    diverged or was interrupted keeps what it wrote, for its curves and its resume."""
    try:
        yield
    except UserError as err:
        kept_for_its_records = isinstance(err, (TrainingDiverged, TrainingInterrupted))
        if new and not kept_for_its_records and not _resumable(run_dir) and not _has_records(run_dir):
            discard_run(run_dir)
        raise
    except (MemoryError, RuntimeError, OutputClosed) as err:
        if not isinstance(err, OutputClosed) and not is_out_of_memory(err):
            raise
        resumable = _resumable(run_dir)
        if new and not resumable:
            discard_run(run_dir)
        if isinstance(err, OutputClosed):
            raise
        kept = f"; {run_dir} keeps its last checkpoint (mlptrain run --resume {run_dir})" if resumable else ""
        raise UserError(out_of_memory(err) + kept) from None


def _resumable(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "last.npz").is_file()


def _has_records(run_dir: Path) -> bool:
    try:
        return (run_dir / "metrics.jsonl").stat().st_size > 0
    except OSError:
        return False


def run_config(config: Config, dataset=None, backend: str | None = None) -> dict:
    """What a run's config.yaml holds: the config as the run uses it (`run_record`: overrides applied, the
    backend it runs on, the data folder it reads, its own model type's keys), and under `resolved` what
    the run actually read (the dataset: `mlptrain.data.dataset_record`)."""
    document = run_record(config, backend)
    if dataset is not None:
        document[RESOLVED] = {"dataset": dataset_record(dataset, config.data.val_size)}
    return document


def run_record(config: Config, backend: str | None = None) -> dict:
    """The config as a run records it: `backend` the one it runs on (auto resolved), `data.root` the
    folder it reads and `data.path` the file, both absolute (evaluate, predict and export read the run's
    config.yaml from wherever they are started), and only its own model type's keys
    (mlptrain.config.load.resolved_dict)."""
    record = resolved_dict(config, backend, data_root(config))
    data = record["data"]
    data["root"] = os.path.abspath(expand_user(str(data["root"]), "data.root"))
    if data.get("path"):
        data["path"] = os.path.abspath(expand_user(str(data["path"]), "data.path"))
    return record


def data_root(config: Config) -> Path:
    """The folder the config's dataset is read from."""
    return Path(config.data.root) if config.data.root else default_data_root()


def check_same_dataset(run_dir: Path, config: Config, dataset, command: str | None = None,
                       remedy: str = "resume with the data it started with") -> None:
    """Refuse to resume (or evaluate, ...) `run_dir` on other data than it started with: the checksum its
    config.yaml recorded must be the loaded dataset's (a run written before the record existed is not
    checked). `command` (default `--resume RUN_DIR`) and `remedy` begin and end the refusal."""
    raw = read_yaml(run_dir / "config.yaml")
    resolved = raw.get(RESOLVED) if isinstance(raw, dict) else None
    recorded = resolved.get("dataset") if isinstance(resolved, dict) else None
    if not isinstance(recorded, dict) or "checksum" not in recorded:
        return
    now = dataset_record(dataset, config.data.val_size)
    if now["checksum"] != recorded["checksum"]:
        raise UserError(f"{command or f'--resume {run_dir}'}: its data changed since the run started "
                        f"({now['location']} has checksum {now['checksum']}, the run recorded {recorded['checksum']} "
                        f"from {recorded.get('location')}); {remedy}")
