"""Sweeps: many runs of one base config, their values chosen by Optuna, shared through its storage.

Every trial a sweep will run is created once, when its study is: a grid queues
each point of its product, random and tpe queue `trials` empty slots whose
values the sampler picks when a worker takes one. Workers (this process, child
processes, or other machines sharing the storage) only ever take queued
trials, and the storage moves a trial from WAITING to RUNNING atomically, so
no trial runs twice and nothing beyond the plan runs. (Optuna's GridSampler on
its own may repeat a point under several workers, so it only names the grid.)

A running trial beats a heartbeat. When a worker dies, its trial stops beating
and, GRACE_S later, any worker fails it and queues a copy with the same values
(`retry_of`); Ctrl-C queues the copy at once. A trial that raises (diverges, a
config the sweep's combination makes invalid) is told FAIL with its message in
`error` and is not retried. Re-running the sweep's command opens the same study
and takes what is left.
"""

from __future__ import annotations

import fcntl
import math
import shutil
import signal
import threading
import time
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

import optuna
import sqlalchemy
from optuna.trial import TrialState
from sqlalchemy import event

from mlptrain.config.safe_yaml import brief
from mlptrain.errors import TrainingInterrupted, UserError
from mlptrain.run_dirs.lock import release_run
from mlptrain.sweep import claims
from mlptrain.sweep.report import format_metric, format_params, log_hparams
from mlptrain.sweep.spec import METRICS, Sweep
from mlptrain.training.experiment import Resources, create_run
from mlptrain.training.loop import train
from mlptrain.training.session import build_session
from mlptrain.util.atomic import replacing
from mlptrain.util.console import console
from mlptrain.util.user_paths import cache_folder

HEARTBEAT_S = 10  # how often a running trial says it is alive
GRACE_S = 30  # silence after which its worker is taken for dead and the trial is queued again
POLL_S = 2  # how often a worker with nothing to take looks again
SETUP_WAIT_S = 60  # how long to wait for another worker to finish queueing a new study's trials
PRUNE_AFTER_TRIALS = 5  # Optuna's default: the median of fewer finished trials is noise
STUDY_CACHE_ENV = "MLPTRAIN_STUDY_CACHE"  # where the empty study file is kept (see _new_storage)
READY = ".study-ready"  # in the sweep folder once its study exists: `--worker` children wait for it

optuna.logging.set_verbosity(optuna.logging.WARNING)


@contextmanager
def _quiet():
    """Heartbeats are marked experimental in Optuna; the warning would print on every run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


class _QueuedGridSampler(optuna.samplers.GridSampler):
    """Every point comes from the queue with fixed values, so the sampler never picks one. Its
    after_trial only stops `study.optimize`, which sweeps do not use, and needs a `grid_id` that
    queued trials lack."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def _sampler(sweep: Sweep):
    if sweep.method == "grid":
        return _QueuedGridSampler({p.name: p.stored for p in sweep.parameters})
    if sweep.method == "random":
        return optuna.samplers.RandomSampler()
    return optuna.samplers.TPESampler(constant_liar=True)  # several workers: running trials count as bad


def _requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue a trial that stopped without an outcome (its worker died or was interrupted) to run again,
    with the values it had, as a new trial marked `retry_of`."""
    if any(t.user_attrs.get("retry_of") == trial.number for t in study.get_trials(deepcopy=False)):
        return
    params = {**trial.system_attrs.get("fixed_params", {}), **trial.params}
    study.enqueue_trial(params, user_attrs={"retry_of": trial.number})


def database_url(url: str) -> str:
    """`url` with a PostgreSQL driver named when it names none: SQLAlchemy 2.1's default for postgresql://
    is psycopg 3, so psycopg2 alone would fail; whichever is installed is used, psycopg first."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    rest = url.split("://", 1)[1]
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise UserError(f"--storage {_redacted(url)}: no PostgreSQL driver is installed; pip install 'mlptrain[postgres]' "
                    "(psycopg 3), or psycopg2 and write postgresql+psycopg2://")


def _storage(url: str, checked: bool = False):
    """Optuna's RDB storage at `url`. `checked`: the sweep's own command has just made (or checked) the
    tables, so their creation and the schema's version check are skipped."""
    url = database_url(url)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}  # workers wait their turn
    try:
        with _quiet():
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, skip_compatibility_check=checked,
                                              skip_table_creation=checked)
    except Exception as err:  # a bad URL, a missing driver, an unreachable server: one line
        raise UserError(f"--storage {_redacted(url)}: cannot open it ({type(err).__name__}: {err})") from None


def _new_storage(url: str):
    """The storage of a new study at `url`. A new SQLite file starts as a copy of an empty one made before by
    this Optuna and SQLAlchemy (kept in $MLPTRAIN_STUDY_CACHE, else the user cache folder's
    mlptrain/studies; `off` turns it off), so that its tables and Alembic's stamp are not made again:
    Optuna reads its ~30 migration scripts for that, about a third of a second before the first trial. The
    first new file on a machine is made by Optuna and copied there."""
    database = sqlite_file(url)
    template = _study_template()
    if database is None or template is None or database.exists():
        return _storage(url)
    try:
        with open(template, "rb") as source, open(database, "xb") as target:  # never over another's file
            shutil.copyfileobj(source, target)
        return _storage(url, checked=True)
    except FileExistsError:  # another command made it meanwhile: it is opened as it is
        return _storage(url)
    except FileNotFoundError:  # no copy yet: Optuna makes the file, and it is copied for the next study
        pass
    except (OSError, UserError):  # an unreadable or damaged copy: Optuna makes the file afresh
        database.unlink(missing_ok=True)
    storage = _storage(url)
    with suppress(OSError):  # a cache that cannot be written only costs the next study the same time
        template.parent.mkdir(parents=True, exist_ok=True)
        with replacing(template, durable=False) as copy, open(database, "rb") as made:
            shutil.copyfileobj(made, copy)  # before WAL mode: every table is in the file itself
    return storage


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL; None for another database or an in-memory one."""
    # SQLAlchemy (Optuna's storage) only when a storage URL is given
    from sqlalchemy.engine import make_url

    parsed = make_url(database_url(url))
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _study_template() -> Path | None:
    """Where the empty study file of this Optuna and SQLAlchemy is kept; None when the cache is off."""
    folder = cache_folder(STUDY_CACHE_ENV, "studies")
    if folder is None:
        return None
    return folder / f"empty-optuna-{optuna.__version__}-sqlalchemy-{sqlalchemy.__version__}.db"


def _write_ahead_log(storage) -> None:
    """SQLite in write-ahead-log mode (a setting of the file, kept): readers no longer block the writer nor it
    them, so workers' polls, heartbeats and claims do not queue behind each other (sqlite.org/wal.html)."""
    if storage.engine.url.get_backend_name() == "sqlite":
        with storage.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")


def _sync_at_checkpoints(storage) -> None:
    """Each SQLite connection with synchronous=NORMAL: in WAL mode a commit then needs no fsync of its own
    (the WAL is synced at checkpoints) and the file still cannot be corrupted; a power cut may only undo the
    last commits, so a claimed trial runs again (sqlite.org/pragma.html#pragma_synchronous). A trial makes
    a dozen commits (claim, heartbeats, attributes, its outcome)."""
    if storage.engine.url.get_backend_name() != "sqlite":
        return

    def on_connect(connection, _record):
        connection.execute("PRAGMA synchronous=NORMAL")

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # the connections opened so far were made before the listener


def _redacted(url: str) -> str:
    # SQLAlchemy (Optuna's storage) only when a storage URL is given
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def check_storage_url(url: str) -> None:
    # SQLAlchemy (Optuna's storage) only when a storage URL is given
    from sqlalchemy.engine import make_url

    try:
        make_url(url)
    except Exception:
        raise UserError(f"--storage {url}: not a database URL (e.g. postgresql://user:password@host/db, "
                        "sqlite:///path/study.db)") from None


@contextmanager
def _setup_lock(folder: Path):
    """Serialises set-up among this machine's workers (the SQLite schema is created on first open)."""
    with open(folder / ".setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def open_study(sweep: Sweep, sweep_dir: Path, name: str, url: str, worker: bool = False):
    """(study, storage): the study `name`, created with its whole queue, or the one that exists,
    which must be this same sweep. `worker`: a `--worker` child of this machine's sweep command, which
    opens the study (it waits for that) and checks it: the child loads it without the set-up lock and
    schema checks."""
    pruner = optuna.pruners.MedianPruner(n_startup_trials=PRUNE_AFTER_TRIALS) if sweep.prune \
        else optuna.pruners.NopPruner()
    if worker:
        _wait_for_study(sweep_dir, url)
        storage = _storage(url, checked=True)
        _sync_at_checkpoints(storage)
        study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(sweep), pruner=pruner)
        _check_same_sweep(study, sweep, sweep_dir, url)
        return study, storage
    with _setup_lock(sweep_dir):
        storage = _new_storage(url)
        _write_ahead_log(storage)
        _sync_at_checkpoints(storage)
        try:
            study = optuna.create_study(storage=storage, study_name=name, sampler=_sampler(sweep), pruner=pruner,
                                        direction=sweep.direction)
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(sweep), pruner=pruner)
            _check_same_sweep(study, sweep, sweep_dir, url)
        else:
            for params in sweep.grid() if sweep.method == "grid" else [{}] * sweep.trials:
                study.enqueue_trial(params)
            study.set_user_attr("sweep", sweep.definition())  # last: tells other workers the queue is complete
        (sweep_dir / READY).touch()
    return study, storage


def _wait_for_study(sweep_dir: Path, url: str) -> None:
    """A `--worker` child starts before its parent has opened the study (so that its own start overlaps
    the parent's): it waits until the study exists."""
    deadline = time.monotonic() + SETUP_WAIT_S
    while not (sweep_dir / READY).exists():
        if time.monotonic() > deadline:
            raise UserError(f"{_redacted(url)}: the sweep command that started this worker never opened its study")
        time.sleep(0.05)


def _check_same_sweep(study, sweep: Sweep, sweep_dir: Path, url: str) -> None:
    deadline = time.monotonic() + SETUP_WAIT_S
    while "sweep" not in study.user_attrs:
        if time.monotonic() > deadline:
            raise UserError(f"study '{study.study_name}' in {_redacted(url)} was created but its trials were never "
                            "queued (its creator stopped); delete it (optuna delete-study) or choose another --name")
        time.sleep(0.5)
    stored, wanted = study.user_attrs["sweep"], sweep.definition()
    changed = [key for key in wanted if stored.get(key) != wanted[key]]
    if changed:
        raise UserError(f"{sweep_dir}: this sweep was started with a different {', '.join(changed)} "
                        f"({_differences(stored, wanted, changed)}); re-run it unchanged to continue it, or choose "
                        "another --name")


def _differences(stored: dict, wanted: dict, changed: list[str], shown: int = 3) -> str:
    """What differs, by dotted key (`base.optim.lr: 0.001 then, 0.01 now`), the first `shown` of them."""
    def flat(value, prefix):
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}.{key}").items()}
        return {prefix: value}

    then = {k: v for key in changed for k, v in flat(stored.get(key), key).items()}
    now = {k: v for key in changed for k, v in flat(wanted.get(key), key).items()}
    keys = sorted(key for key in {*then, *now} if then.get(key, _ABSENT) != now.get(key, _ABSENT))
    def shown_value(values, key):
        return brief(values[key]) if key in values else "unset"

    parts = [f"{key}: {shown_value(then, key)} then, {shown_value(now, key)} now" for key in keys[:shown]]
    return "; ".join(parts) + (f"; and {len(keys) - shown} more" if len(keys) > shown else "")


_ABSENT = object()


class _Heartbeat:
    """Records the trial's heartbeat every HEARTBEAT_S from a thread while it trains."""

    def __init__(self, storage, trial_id: int):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(storage, trial_id), daemon=True)

    def _beat(self, storage, trial_id: int) -> None:
        warned = False
        while not self._stop.wait(HEARTBEAT_S):
            try:
                storage.record_heartbeat(trial_id)
            except Exception as err:  # a busy database: a missed beat matters only after GRACE_S of them
                if not warned:
                    console.print(f"[yellow]warning:[/] the trial's heartbeat failed ({type(err).__name__}: "
                                  f"{err}); after {GRACE_S} s without one, other workers take the trial over")
                    warned = True

    def __enter__(self):
        self._thread.start()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def claim_next(study, storage, study_id: int):
    """(trial, trial_id) of a queued trial this worker now runs, or None when the queue is empty. The claim
    is one transaction (mlptrain.sweep.claims), so no other worker takes the same trial."""
    worker = claims.this_worker()
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        storage.record_heartbeat(trial_id)  # before the claim, so that no claimed trial lacks a heartbeat
        if claims.claim(storage, trial_id, worker):
            return optuna.trial.Trial(study, trial_id), trial_id
    return None


def requeue_stale(study, storage, study_id: int) -> int:
    """Fail the running trials whose worker is gone (claims.abandoned) and queue each again; of several
    workers doing this at once, only the one whose release succeeds queues the re-run. Returns how many
    this call queued again."""
    queued = 0
    for trial_id in claims.abandoned(storage, study_id, GRACE_S):
        if claims.release(storage, trial_id):
            frozen = storage.get_trial(trial_id)
            console.print(f"trial {frozen.number}: its worker is gone; queued again")
            _requeue(study, frozen)
            queued += 1
    return queued


def work(study, storage, sweep: Sweep, sweep_dir: Path, resources: Resources, on_trial_end=None,
         wait_for_others: bool = True, stop=None, progress: bool = True) -> None:
    """Run queued trials until none is left, then (`wait_for_others`) wait for the ones other workers are
    running: when one of those workers dies, its trial is queued again and taken here. A worker started by
    this machine's sweep command does not wait: that parent sees its children end and queues a dead one's
    trial again itself (mlptrain.sweep.workers). `stop` (with a `signum`, read after every optimizer step):
    once set, the running trial is queued again and no other is taken (a sweep's trial threads stop this
    way, mlptrain.sweep.threads). `progress`: a progress bar while a trial trains."""
    study_id = storage.get_study_id_from_name(study.study_name)
    waiting_for = None
    while stop is None or not stop.signum:
        requeue_stale(study, storage, study_id)
        claimed = claim_next(study, storage, study_id)
        if claimed is not None:
            _run_trial(study, storage, *claimed, sweep, sweep_dir, resources, stop, progress)
            if on_trial_end is not None:
                on_trial_end()
            continue
        if not wait_for_others:
            return
        running = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        if not running:
            return
        if running != waiting_for:
            console.print(f"waiting for trial(s) {', '.join(map(str, running))}, running in other workers")
            waiting_for = running
        time.sleep(POLL_S)


@dataclass
class _Attempt:
    params: dict
    config: object = None
    run_dir: Path | None = None
    last: dict = field(default_factory=dict)  # the latest evaluation record


def _run_trial(study, storage, trial, trial_id: int, sweep: Sweep, sweep_dir: Path, resources: Resources,
               stop=None, progress: bool = True) -> None:
    attempt = _Attempt(sweep.suggest(trial))
    console.print(f"[bold]trial {trial.number}[/]: {format_params(attempt.params)}")
    try:
        _attempt(study, storage, trial, trial_id, attempt, sweep, sweep_dir, resources, stop, progress)
    finally:
        if attempt.run_dir is not None:
            release_run(attempt.run_dir)


def _attempt(study, storage, trial, trial_id: int, attempt, sweep: Sweep, sweep_dir: Path, resources, stop,
             progress: bool) -> None:
    with _Heartbeat(storage, trial_id):
        try:
            summary = _train(trial, attempt, sweep, sweep_dir, resources, stop, progress)
        except optuna.TrialPruned as pruned:
            console.print(f"trial {trial.number}: {pruned}")
            _tell(study, trial, TrialState.PRUNED, attempt, attempt.last)
        except KeyboardInterrupt:
            with _signals_held():
                _requeue(study, storage.get_trial(trial_id))
                _tell(study, trial, TrialState.FAIL, attempt, attempt.last)
            raise
        except TrainingInterrupted:  # `stop` was set (another thread got the signal): the same, from a thread
            _requeue(study, storage.get_trial(trial_id))
            _tell(study, trial, TrialState.FAIL, attempt, attempt.last)
            console.print(f"trial {trial.number}: stopped; queued again")
        except Exception as err:  # the trial failed, the sweep goes on
            error = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            if not isinstance(err, UserError):
                console.print_exception(max_frames=8)
            console.print(f"[bold red]trial {trial.number} failed:[/] {error}", highlight=False)
            _tell(study, trial, TrialState.FAIL, attempt, attempt.last, error=error)
        else:
            value = summary[sweep.metric]
            console.print(f"trial {trial.number}: {sweep.metric} {format_metric(value)}")
            _tell(study, trial, TrialState.COMPLETE, attempt, summary, value=value)


def _train(trial, attempt: _Attempt, sweep: Sweep, sweep_dir: Path, resources: Resources, stop,
           progress: bool) -> dict:
    attempt.config = sweep.trial_config(attempt.params, "its config")
    with resources.allocating():  # refusals before the folder
        session = build_session(attempt.config, *resources.prepare(attempt.config))
    attempt.run_dir = create_run(attempt.config, sweep_dir, f"trial-{trial.number:04d}", "trial",
                                 suffix_on_clash=True, dataset=session.dataset, backend=session.backend.name)
    trial.set_user_attr("run_dir", str(attempt.run_dir))
    worse = "below" if sweep.direction == "maximize" else "above"

    def on_evaluation(record: dict) -> None:
        attempt.last = record
        if sweep.metric in record:
            trial.report(record[sweep.metric], record["epoch"])
            if sweep.prune and trial.should_prune():
                value = format_metric(record[sweep.metric])
                raise optuna.TrialPruned(f"pruned after epoch {record['epoch']}: {sweep.metric} {value} is {worse} "
                                         "the other trials' median")

    summary = train(session, attempt.run_dir, on_evaluation, stop=stop, progress=progress)
    value = summary.get(sweep.metric)
    if sweep.metric not in summary:
        raise UserError(f"the run reports no {sweep.metric} (its metrics: "
                        f"{', '.join(k for k in METRICS if k in summary)}); choose one of those for the sweep")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"the run's {sweep.metric} is {value!r}; a trial needs a finite value to rank")
    return summary


def _tell(study, trial, state, attempt: _Attempt, metrics: dict, value=None, error: str | None = None) -> None:
    kept = {k: metrics[k] for k in METRICS if isinstance(metrics.get(k), (int, float))}
    try:
        trial.set_user_attr("metrics", kept)
        if error is not None:
            trial.set_user_attr("error", error)
        study.tell(trial, value, state=state)
    except optuna.exceptions.UpdateFinishedTrialError:
        console.print(f"trial {trial.number}: another worker took it over (its heartbeat lapsed); its result "
                      "here is dropped")
        return
    outcome = state == TrialState.PRUNED or error is not None  # not an interrupted attempt, which runs again
    if outcome and attempt.run_dir is not None and not (attempt.run_dir / "summary.json").exists():
        log_hparams(attempt.run_dir)  # a finished run has logged its own


@contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait while an interrupted trial is queued again, so the queue is never left
    half-written."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
