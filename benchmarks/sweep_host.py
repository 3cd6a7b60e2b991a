"""Where a sweep's host time goes: its start, its training and its end, by the functions the host calls.

    python benchmarks/sweep_host.py [--trials 16] [--epochs 10] [--flags "--pack 16"] [--repeats 1]
                                    [--top 15] [--also "module:function ..."] [--set KEY=VALUE ...] [--json FILE]

Runs `mlptrain sweep` of adam_mnist's K trials (benchmarks/packed_trials.py's sweep file: its learning rates x as
many seeds as needed) in a child process whose chosen functions are wrapped by timers, as benchmarks/startup.py does for a run.
Each call is counted in the phase it starts in: the start (before the first optimizer step is launched: a packed
group's first flush, else a run's first window), the training, and the end (after the last step's launch), and
by its thread: the one that feeds the steps ("feeding") or any other ("others": the writers, the reports, the
pinned memory). A generator (a run's training, an epoch's evaluation) counts each stretch it runs in the phase of
that stretch, not the time it waits for the others (its call in the phase it began). The sweep must complete every trial before anything is printed.

The table: per phase, the functions with the most milliseconds (the median over --repeats of their sums), their
calls and milliseconds a call; the driver's copies are split at 64 KB (larger ones from pageable memory wait in the
driver's staging for the copies queued before them). Wrapping costs ~1 us a call: compare figures of this script
with each other, not with a sweep's wall time. Not wrapped: what a drawing process unpickles (confusion images),
whose wrapper the process could not load.

`--set backend=cpu --set model.hidden=[16]` checks it on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packed_trials import sweep_file  # its neighbour: the script's folder is on the path


# module:function or module:Class.method, timed where called (every module holding the name gets the wrapper)
TARGETS = """
mlptrain.sweep.study:open_study mlptrain.packing.lane_group:slots
mlptrain.sweep.engine:requeue_stale mlptrain.sweep.engine:claim_next mlptrain.sweep.engine:_tell
mlptrain.sweep.spec:Sweep.suggest mlptrain.sweep.spec:Sweep.trial_config
mlptrain.training.experiment:Resources.prepare mlptrain.training.experiment:create_run
mlptrain.training.session:build_session mlptrain.training.memory_plan:check_fits mlptrain.data.loader:resident_splits
mlptrain.nn.graph:StaticGraph.init_seeded mlptrain.optim.schedules:lr_table
mlptrain.run_dirs.folders:write_yaml mlptrain.run_dirs.lock:lock_run mlptrain.run_dirs.lock:release_run
mlptrain.run_dirs.records:RunLogger.__init__ mlptrain.training.compilation:compile_kernels
mlptrain.training.loop:training mlptrain.training.loop:_after_evaluation
mlptrain.training.evaluation:Evaluator.epoch_record_steps mlptrain.training.evaluation:Evaluator.launch_split
mlptrain.training.evaluation:Evaluator.read_rows mlptrain.training.evaluation:Evaluator.split_metrics
mlptrain.training.evaluation:Evaluator.log mlptrain.training.checkpoint_writes:write_checkpoints
mlptrain.training.checkpoint:save_checkpoint mlptrain.training.run_end:close_run
mlptrain.training.diagnosis:learning_warning
mlptrain.packing.lane_group:LaneGroup.flush mlptrain.packing.lane_group:LaneGroup._step
mlptrain.training.window:TrainingWindow.run
mlptrain.backends.driver.api:to_device mlptrain.backends.driver.api:to_host mlptrain.backends.driver.api:pinned
mlptrain.backends.driver.api:memory_info mlptrain.backends.driver.api:launch
optuna.storages.journal._file:JournalFileBackend.append_logs optuna.trial._trial:Trial.report
optuna.trial._trial:Trial.set_user_attr optuna.study.study:Study.tell
"""
# what launches the optimizer steps: the phases' edges (a flush launches every lane's windows up to their next
# read, step after step, each a `_step`; a version before that, a step a flush)
STEPS = ("LaneGroup.flush", "LaneGroup._step", "TrainingWindow.run")
SIZED = ("to_device", "to_host")  # the driver's copies, split by size (their third argument)

# The child: wraps TARGETS, runs the command, writes [(label, thread, start s, seconds, a new call?)] and the end.
CHILD = r"""
import atexit, importlib, inspect, json, os, sys, threading, time
T0 = time.perf_counter()
calls, out = [], os.environ["SWEEP_HOST_OUT"]

def record(label, start, seconds, new=True):  # a thread as "pid-ident": the trainer's and the command's apart
    calls.append((label, f"{os.getpid()}-{threading.get_ident()}", start - T0, seconds, new))

def after_fork():  # the trainer (sweep_host.COMMAND): its own calls only
    calls.clear()

def timed(fn, label):
    sized = label.endswith(SIZED)
    if inspect.isgeneratorfunction(fn):
        def generator(*args, **kwargs):  # each stretch it runs, in its own phase; not while it is suspended
            gen, value, error, new = fn(*args, **kwargs), None, None, True
            while True:
                start = time.perf_counter()
                try:
                    yielded = gen.send(value) if error is None else gen.throw(error)
                except StopIteration as stop:
                    record(label, start, time.perf_counter() - start, new)
                    return stop.value
                record(label, start, time.perf_counter() - start, new)
                new = False
                try:
                    value, error = (yield yielded), None
                except BaseException as err:
                    value, error = None, err
        return generator
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            name = label
            if sized and len(args) > 2:
                name += " >=64K" if args[2] >= 65536 else " <64K"
            record(name, start, time.perf_counter() - start)
    return wrapper

wrapped = {}

def instrument():  # run by COMMAND: at once, or in the trainer only (--trainer)
    for target in TARGETS.split():
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
            owner, name = (getattr(module, attr.split(".")[0]), attr.split(".")[1]) if "." in attr else (module, attr)
            fn = getattr(owner, name)
        except (ImportError, AttributeError) as err:
            print(f"sweep_host: cannot time {target}: {err}", file=sys.stderr)
            continue
        label = attr if "." in attr else f"{module_name.rsplit('.', 1)[-1]}.{attr}"
        replacement = timed(fn, label)
        setattr(owner, name, replacement)
        wrapped[id(fn)] = (fn, replacement)
    for module_name, module in list(sys.modules.items()):  # names imported before the wrapping: the wrapper too
        if module_name.startswith(("mlptrain", "optuna")):
            for key, value in list(vars(module).items()):
                if id(value) in wrapped and wrapped[id(value)][0] is value:
                    setattr(module, key, wrapped[id(value)][1])

def dump():
    if getattr(dump, "done", False):
        return
    dump.done = True
    with open(out, "w") as file:
        json.dump({"calls": calls, "end": time.perf_counter() - T0}, file)

"""


# The end of every profiling child (this script's, sweep_timeline.py's, sweep_samples.py's): its `dump()` run at the
# command's end, then the command run as `mlptrain` runs it (mlptrain.__main__: its first steps, and os._exit once
# Python's exit steps have run, which the wrapper makes write the record first), so the child's wall time is the
# command's. A process the command forks (a single-GPU sweep's trainer, mlptrain.sweep.prefork) inherits all of it:
# its `after_fork()` (each CHILD's) starts its record afresh, written beside the command's (`records`). The command
# forks its trainer only while no thread but its main one runs, which each CHILD's `instrument()` (imports that
# start NumPy's BLAS threads, a sampler thread) would end: `--trainer` runs it in the trainer alone, after the fork.
COMMAND = r"""
import atexit
atexit.register(dump)
TRAINER_ONLY = os.environ.get("SWEEP_PROFILE_TRAINER") == "1"  # nothing started here: the command can fork
if not TRAINER_ONLY:
    instrument()

def trainers_record():
    global out
    out += ".trainer"
    after_fork()
    if TRAINER_ONLY:
        instrument()

os.register_at_fork(after_in_child=trainers_record)
_exit = os._exit
def exiting(code):
    try:
        dump()
    finally:
        _exit(code)
os._exit = exiting
sys.argv = ["mlptrain"] + sys.argv[1:]
import mlptrain.__main__
mlptrain.__main__.main()
"""


def child_code(also: str = "") -> str:
    """The child's code, timing TARGETS and `also` (more module:function names, space-separated)."""
    return f"TARGETS = {TARGETS + ' ' + also!r}\nSTEPS = {STEPS!r}\nSIZED = {SIZED!r}\n" + CHILD + COMMAND


def sweep_in_child(args, folder: Path, name: str, epochs: int, code: str, out_variable: str) -> tuple[float, list]:
    """`mlptrain sweep` of adam_mnist's args.trials trials (`epochs` each, args.set, args.flags) run by `code` in a
    `python -c` child (nothing for a spawned drawing process to import again), which writes its record where the
    environment's `out_variable` says: (its wall seconds, the trials' results rows); exits on a failed sweep or one
    whose every trial did not complete once."""
    command = [sys.executable, "-c", code, "sweep", str(sweep_file("mnist", args.trials, folder)[0]),
               f"train.epochs={epochs}", *args.set, "--runs-dir", str(folder / "runs"), "--name", name,
               *args.flags.split()]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, out_variable: str(folder / f"{name}.json"),
                               "SWEEP_PROFILE_TRAINER": "1" if args.trainer else "0"})
    wall = time.perf_counter() - began
    if done.returncode:
        sys.exit(f"FAILED ({done.returncode}): {' '.join(command[3:])}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    trials = json.loads((folder / "runs" / name / "results.json").read_text())["trials"]
    if len(trials) != args.trials or any(t["state"] != "complete" for t in trials):
        sys.exit(f"WRONG RESULT: {[(t['params'], t['state']) for t in trials]}")
    return wall, trials


def records(folder: Path, name: str) -> tuple[dict, dict | None]:
    """A profiled sweep's records: the command's, and its trainer's where a trainer process trained (None
    where the command trained itself)."""
    trainer = folder / f"{name}.json.trainer"
    return (json.loads((folder / f"{name}.json").read_text()),
            json.loads(trainer.read_text()) if trainer.exists() else None)


def one_sweep(args, folder: Path, name: str) -> dict:
    """One sweep in a child: its calls by phase and thread (the trainer's with the command's), and its wall time;
    exits on a failed or incomplete sweep."""
    wall, _ = sweep_in_child(args, folder, name, args.epochs, child_code(args.also), "SWEEP_HOST_OUT")
    data, trainer = records(folder, name)
    if trainer is not None:
        data["calls"] += trainer["calls"]
    steps = [(start, thread) for label, thread, start, _, _ in data["calls"] if label.endswith(STEPS)]
    if not steps:
        sys.exit("WRONG RESULT: no optimizer step was timed")
    first, last, feeding = min(steps)[0], max(steps)[0], {thread for _, thread in steps}
    sums: dict[tuple, list] = {}
    for label, thread, start, seconds, new in data["calls"]:
        phase = "start" if start < first else "end" if start > last else "training"
        entry = sums.setdefault((phase, label, "feeding" if thread in feeding else "others"), [0, 0.0])
        entry[0] += new  # a generator's stretches count as one call, in the phase it began
        entry[1] += seconds
    return {"wall_s": wall, "first_step_s": first, "last_step_s": last, "end_s": data["end"],
            "sums": {" | ".join(key): value for key, value in sums.items()}}


def sweep_arguments(doc: str, flags_help: str) -> argparse.ArgumentParser:
    """The arguments of a script that profiles one sweep in a child (this one, sweep_timeline.py)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--flags", default="--pack 16", help=flags_help)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], help="a config override, e.g. backend=cpu")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--trainer", action="store_true", help="profile the trainer process of a single-GPU sweep "
                        "(mlptrain.sweep.prefork) alone; without it the profiling starts threads before the command's "
                        "first line, which then trains in its own process")
    return parser


def profiled_sweeps(args, one_sweep, prefix: str) -> tuple[list, dict]:
    """An untimed one-epoch sweep (the kernels in the cache, as for a user's second sweep), then args.repeats
    profiled by `one_sweep(args, folder, name)` (a dict with wall_s, first_step_s, last_step_s and end_s): (their
    records, the medians of those four)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        folder = Path(scratch)
        one_sweep(argparse.Namespace(**{**vars(args), "epochs": 1}), folder, "warm")
        runs = [one_sweep(args, folder, f"timed-{i}") for i in range(args.repeats)]
    keys = ("wall_s", "first_step_s", "last_step_s", "end_s")
    return runs, {key: statistics.median(run[key] for run in runs) for key in keys}


def headline(args, median: dict) -> str:
    return (f"{args.trials} trials x {args.epochs} epochs, `mlptrain sweep {args.flags}` {' '.join(args.set)}; median "
            f"of {args.repeats}: wall {median['wall_s']:.2f} s; in the process, the first step at "
            f"{median['first_step_s']:.3f} s, the last at {median['last_step_s']:.3f} s, the end at "
            f"{median['end_s']:.3f} s")


def main() -> None:
    parser = sweep_arguments(__doc__, "the sweep's flags, e.g. '--pack 16' or ''")
    parser.add_argument("--top", type=int, default=15, help="rows per phase")
    parser.add_argument("--also", default="", help="more functions to time, as TARGETS names them (space-separated)")
    args = parser.parse_args()
    runs, median = profiled_sweeps(args, one_sweep, "sweep-host-")
    print(headline(args, median))
    keys = sorted({key for run in runs for key in run["sums"]})
    rows = []
    for key in keys:
        calls = statistics.median(run["sums"].get(key, [0, 0.0])[0] for run in runs)
        ms = statistics.median(run["sums"].get(key, [0, 0.0])[1] for run in runs) * 1e3
        rows.append((*key.split(" | "), calls, ms))
    print("| phase | function | thread | calls | ms | ms a call |\n| --- | --- | --- | --- | --- | --- |")
    for phase in ("start", "training", "end"):
        ranked = sorted((row for row in rows if row[0] == phase), key=lambda row: -row[4])[:args.top]
        for _, label, thread, calls, ms in ranked:
            each = f"{ms / calls:.2f}" if calls else "-"  # a generator begun in an earlier phase
            print(f"| {phase} | {label} | {thread} | {calls:g} | {ms:.1f} | {each} |")
    if args.json:
        args.json.write_text(json.dumps({"median": median, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
