"""`--workers K`: K child processes, each the same sweep command with one worker.

Each child takes queued trials from the shared study like any other worker, so
K processes here and more on other machines divide one sweep the same way. The
parent trains nothing: it starts the children (one GPU each when there are
several), reports trials as they end, and passes Ctrl-C on.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

from mlptrain.backends.cuda import cuda_usable, gpu_count
from mlptrain.sweep.report import format_metric, format_params, trial_rows
from mlptrain.util.console import console

POLL_S = 2
STOP_WAIT_S = 60  # how long stopped workers get to queue their trials again before they are killed
PR_SET_PDEATHSIG = 1  # prctl(2)


def gpu_slots(backend: str) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES of each worker in turn: one GPU each when there are several, else unpinned."""
    if backend == "cpu" or not cuda_usable():
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    else:
        ids = [str(i) for i in range(gpu_count())]
    return ids if len(ids) > 1 else [None]


def run_workers(command: list[str], workers: int, backend: str, sweep_dir: Path, study, sweep) -> list[str]:
    """Runs `command` in `workers` processes until all exit; returns a line for each that failed."""
    slots = gpu_slots(backend)
    procs = []
    for i in range(workers):
        env = dict(os.environ)
        if slots[i % len(slots)] is not None:
            env["CUDA_VISIBLE_DEVICES"] = slots[i % len(slots)]
        with open(sweep_dir / f"worker-{i}.log", "a") as log:
            # a session of its own: Ctrl-C reaches a worker once, from here, not also from the terminal
            procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True, preexec_fn=die_with_parent))
    pinned = f", GPUs {', '.join(s for s in slots[:workers])}" if slots[0] is not None else ""
    console.print(f"{workers} workers started{pinned}; their output goes to {sweep_dir}/worker-N.log")
    try:
        _report_until_done(procs, study, sweep)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (interrupt.Terminated): the workers get the same
        stop_workers(procs, getattr(err, "signum", signal.SIGINT))
        raise
    return [f"worker {i} {_ending(p.returncode)} (see {sweep_dir}/worker-{i}.log)"
            for i, p in enumerate(procs) if p.returncode != 0]


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


def die_with_parent() -> None:
    """In each worker (Linux): SIGTERM when the parent dies, even by SIGKILL, so that none is orphaned."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a parent killed with SIGKILL leaves its workers running
        pass


def _ending(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _report_until_done(procs, study, sweep) -> None:
    reported = {r["number"] for r in trial_rows(study, sweep) if r["state"] in ("complete", "pruned", "failed")}
    while True:
        finished = all(p.poll() is not None for p in procs)
        for row in trial_rows(study, sweep):
            if row["state"] in ("complete", "pruned", "failed") and row["number"] not in reported:
                reported.add(row["number"])
                outcome = row["error"] if row["value"] is None else f"{sweep.metric} {format_metric(row['value'])}"
                console.print(f"trial {row['number']} {row['state']}: {outcome} ({format_params(row['params'])})",
                              highlight=False)
        if finished:
            return
        time.sleep(POLL_S)
