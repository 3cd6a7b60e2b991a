"""`--workers K`: this process and K - 1 child processes, each taking trials from the same study.

Each child is the same sweep command with one worker (`--worker`), and takes queued trials from the
shared study like any other worker, so K processes here and more on other machines divide one sweep
the same way. The command itself is worker 0: it starts its children first (one GPU each when there
are several: it keeps the first, they take the others in turn), so their start-up overlaps its own,
then trains beside them while a thread watches them. A child exits as soon as nothing is queued;
when one dies, its trial is queued again at once and another child takes its place (at most K - 1
times in all, so a trial that kills every worker cannot loop). The sweep ends when the last worker
does. Ctrl-C reaches the children from here, once.

On several GPUs the workers are a process per GPU, each running its share of the K workers as threads
(mlptrain.sweep.threads). Threads of one process share its interpreter, so trials whose steps are short (an
MNIST MLP's) would queue for it; a process per GPU keeps that contention within a GPU. Those children are
forked (mlptrain.sweep.forked), one for every GPU, and the command trains on none: it watches them as it
watches started ones, and a child that dies is replaced by a started one (a child forked once this process
runs threads could deadlock). Where the command cannot fork and a process per GPU is asked for, it starts
them instead and takes the first GPU's share itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

from rich.markup import escape

from mlptrain.backends.cuda import gpu_count
from mlptrain.errors import UserError
from mlptrain.sweep import claims
from mlptrain.sweep.study_trials import requeue_stale
from mlptrain.sweep.gpu_processes import BLAS_THREADS, die_with_parent
from mlptrain.sweep.report import format_metric, format_params, trial_rows
from mlptrain.util.console import console
from mlptrain.util.regular_file import open_regular

POLL_S = 0.5  # how often the parent reports the trials its children finished (a read of the study's new lines)
WAIT_S = 0.01  # how often it looks at its children: the sweep ends within this of its last worker
STOP_WAIT_S = 60  # how long stopped workers get to queue their trials again before they are killed


def gpu_slots(backend: str) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES of each worker in turn: one GPU each when there are several, else unpinned."""
    if backend == "cpu":
        return [None]
    count = gpu_count()  # the driver's own count: the parent never imports numba or makes a CUDA context
    if count < 2:
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else \
        [str(i) for i in range(count)]
    return ids if len(ids) > 1 else [None]


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def blas_share(workers: int) -> dict[str, str]:
    """The environment that gives each of `workers` CPU workers its share of the cores for NumPy's BLAS,
    which otherwise starts a thread per core in every worker: two workers on two cores then took 23.5 s
    for four small trials, one worker 4.7 s, and two workers with a thread each 3.8 s. What the user set
    is kept."""
    each = str(max(1, cores() // workers))
    return {name: os.environ.get(name, each) for name in BLAS_THREADS}


def start_workers(command: list[str], workers: int, slots: list, sweep_dir: Path, first: int = 0,
                  threads: list[int] | None = None, env: dict | None = None) -> dict:
    """Start workers `first` .. `workers` - 1 running `command` (worker 0 is this process when `first` is 1),
    each on its slot of `slots` (gpu_slots) in turn; returns {index: process}. `threads`: worker i is a
    process of threads[i] worker threads (its `--workers`), one GPU each. `env`: added to each one's."""
    procs = {i: _start(command, slots, sweep_dir, i, threads, env) for i in range(first, workers)}
    announce(workers, slots, sweep_dir, first, threads)
    return procs


def announce(workers: int, slots: list, sweep_dir: Path, first: int = 0, threads: list[int] | None = None) -> None:
    """The line that says which workers run where (start_workers; a process per GPU forked, mlptrain.sweep.forked,
    where `first` is 0: this process trains on none)."""
    def on(i):
        return f"{threads[i]} on GPU {slots[i % len(slots)]}" if threads else slots[i % len(slots)]

    gpus = f", GPUs {', '.join(on(i) for i in range(workers))}" if slots[0] is not None else ""
    if threads:
        mine = f"; this process takes GPU {slots[0]}); the others'" if first else "); their"
        who = f"{sum(threads)} workers in {workers} processes, one per GPU ({', '.join(on(i) for i in range(workers))}" \
              f"{mine}"
    elif first:
        who = f"{workers} workers (this process and {workers - 1} more){gpus}; the others'"
    else:
        who = f"{workers} workers started{gpus}; their"
    console.print(f"{who} output goes to {sweep_dir}/worker-N.log", highlight=False)


def _start(command: list[str], slots: list, sweep_dir: Path, i: int, threads: list[int] | None = None,
           extra: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, **(extra or {})}
    if slots[i % len(slots)] is not None:
        env["CUDA_VISIBLE_DEVICES"] = slots[i % len(slots)]
    if threads:
        command = [*command]
        command[command.index("--workers") + 1] = str(threads[i])
    path = sweep_dir / f"worker-{i}.log"
    try:  # appended to, so never through a link put in its place (mlptrain.run_dirs.links)
        log = open_regular(path, "a", follow=False)
    except OSError as err:
        raise UserError(f"{path}: cannot append to it ({err.strerror or err}); remove it") from None
    with log:
        # a session of its own: Ctrl-C reaches a worker once, from here, not also from the terminal
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=die_with_parent)


def run_workers(command: list[str], workers: int, slots: list, sweep_dir: Path, study, sweep, storage=None,
                here=None, procs: dict | None = None, threads: list[int] | None = None, env: dict | None = None,
                on_report=None, since: datetime | None = None) -> list[str]:
    """Runs `command` in child processes, on `slots` (gpu_slots) in turn, until all exit and returns a line
    for each that failed. With `here` (this process's own share: prepare, then take trials until none is
    queued), this process is worker 0 and `workers - 1` children run (`procs`, when start_workers or a fork
    started them already); without it, `workers` children. `storage` lets this process queue a dead child's
    trial again. `threads`, `env`: as for start_workers. `on_report()` runs after each report of trials the
    children finished (the results saved). Trials that finished before `since` (the command's start; by
    default now) are not reported: a re-run does not repeat them."""
    first = 0 if here is None else 1
    if procs is None:
        procs = start_workers(command, workers, slots, sweep_dir, first, threads, env)
    watcher = _Watcher(procs, lambda i: _start(command, slots, sweep_dir, i, threads, env), study, sweep, storage,
                       sweep_dir, restarts=workers - first, on_report=on_report, since=since)
    try:
        if here is None:
            watcher.watch()
        else:
            thread = threading.Thread(target=watcher.guarded_watch, name="sweep-workers", daemon=True)
            thread.start()
            here()
            while thread.is_alive():  # a timed join: Ctrl-C still reaches this (the main) thread
                thread.join(WAIT_S)
            if watcher.error is not None:  # the watch itself failed (the study's storage, say): raised here
                raise watcher.error
        return watcher.failed
    except BaseException as err:  # Ctrl-C or SIGTERM (signals.Terminated), or a refusal: the workers stop too
        watcher.stopped.set()
        stop_workers(list(watcher.procs.values()), getattr(err, "signum", signal.SIGINT)
                     if isinstance(err, KeyboardInterrupt) else signal.SIGTERM)
        raise


class _Watcher:
    """Waits for the children (checked every WAIT_S), reports the trials they finish (every POLL_S), and
    replaces a child that died holding a trial; `failed` collects a line per child that failed."""

    def __init__(self, procs: dict, start, study, sweep, storage, sweep_dir: Path, restarts: int, on_report=None,
                 since: datetime | None = None):
        self.procs, self.start, self.study, self.sweep, self.storage = procs, start, study, sweep, storage
        self.sweep_dir, self.restarts, self.on_report = sweep_dir, restarts, on_report
        self.since = since or datetime.now()  # trials finished before it are not reported
        self.failed: list[str] = []
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def guarded_watch(self) -> None:
        """`watch` in a thread of its own: what it raises is kept for the main thread, which stops the
        children and reports it (a thread's exception would otherwise vanish, children still running)."""
        try:
            self.watch()
        except BaseException as err:
            self.error = err

    def watch(self) -> None:
        # what ended before this command is not reported again; what its workers finished before this
        # thread's first look is
        reported, warned = _finished_before(self.study, self.since), set()
        ended, next_report = set(), time.monotonic() + POLL_S
        while not self.stopped.is_set():
            newly = [i for i, p in self.procs.items() if i not in ended and p.poll() is not None]
            for i in newly:
                ended.add(i)
                if self._replaced(i):
                    ended.discard(i)
            if newly or time.monotonic() >= next_report:
                if _report(self.study, self.sweep, reported, warned=warned) and self.on_report is not None:
                    self.on_report()
                next_report = time.monotonic() + POLL_S
            if len(ended) == len(self.procs):
                return
            time.sleep(WAIT_S)

    def _replaced(self, i: int) -> bool:
        """After child `i` exited: whether a new child took its place (it died during a trial, now queued
        again); a failure is recorded otherwise."""
        code = self.procs[i].returncode
        if code == 0:
            return False
        ending = f"worker {i} {_ending(code)} (see {self.sweep_dir}/worker-{i}.log)"
        if self.storage is not None and self.restarts > 0 and _requeue_its_trial(self.study, self.storage):
            self.restarts -= 1
            console.print(f"[yellow]warning:[/] {ending} during a trial: the trial is queued again and a new "
                          f"worker {i} takes its place", highlight=False)
            self.procs[i] = self.start(i)
            return True
        self.failed.append(ending)
        return False


def _requeue_its_trial(study, storage) -> bool:
    """Queue again the trials whose worker of this machine is gone (its process no longer runs); whether
    there were any."""
    return requeue_stale(study, storage, storage.get_study_id_from_name(study.study_name)) > 0


def stop_workers(procs, signum: int) -> None:
    """Send `signum` to every running worker (each queues its trial again and exits), wait for them, and
    kill any still running STOP_WAIT_S later, so that no worker outlives the sweep."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signum)
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ending(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _finished_before(study, since: datetime) -> set[int]:
    """The numbers of the trials that finished before `since` (Optuna's clock: local time, naive)."""
    if study is None:
        return set()
    return {t.number for t in study.get_trials(deepcopy=False)
            if t.datetime_complete is not None and t.datetime_complete < since}


def _report(study, sweep, reported: set, show: bool = True, warned: set | None = None) -> bool:
    """One line for each trial another process finished since the last report (added to `reported`), and
    a warning for each fallback its run recorded (summary.json) that none reported before (added to `warned`:
    a GPU that CUDA does not offer, say, is said here once, not only in the worker's log); this process
    prints its own trials and warnings as it runs them. Whether any trial finished since."""
    if study is None:
        return False
    before = len(reported)
    mine = {t.number for t in study.get_trials(deepcopy=False)
            if (t.system_attrs.get(claims.WORKER) or {}).get("pid") == os.getpid()}
    for row in trial_rows(study, sweep):
        if row["state"] in ("complete", "pruned", "failed") and row["number"] not in reported:
            reported.add(row["number"])
            if not show or row["number"] in mine:
                continue
            outcome = row["error"] if row["value"] is None else f"{sweep.metric} {format_metric(row['value'])}"
            console.print(f"trial {row['number']} {row['state']}: {outcome} ({format_params(row['params'])})",
                          highlight=False)
            for line in _fallbacks(row.get("run_dir")):
                if warned is not None and line not in warned:
                    warned.add(line)
                    console.print(f"[yellow]warning:[/] trial {row['number']}: {escape(line)}", highlight=False)
    return len(reported) > before


def _fallbacks(run_dir: str | None) -> list[str]:
    """The fallbacks a trial's run recorded (its summary.json), or none where it wrote none or another
    machine's worker ran it (a folder this one cannot read)."""
    try:
        return list(json.loads((Path(run_dir) / "summary.json").read_text()).get("fallbacks", []))
    except (OSError, TypeError, ValueError, AttributeError):
        return []
