"""What each thread of a sweep is doing at its start and its end, sampled: where a packed sweep's host time goes.

    python benchmarks/sweep_samples.py [--trials 16] [--epochs 10] [--flags "--pack 16"] [--repeats 1]
                                       [--interval-ms 1] [--top 25] [--set KEY=VALUE ...] [--json FILE]

Runs `mlptrain sweep` of adam_mnist's K trials (benchmarks/packed_trials.py's sweep file) in a child process with a
sampling thread: every --interval-ms it takes every other thread's Python stack (`sys._current_frames`). Each sample
stands for the time since that thread's previous one (the sampler waits for the interpreter's lock like any
thread, so samples come irregularly), and is counted in its phase: the start (before the first optimizer step is
launched: a packed group's first step, else a run's first window), the training, and the end (after the last
step's launch). benchmarks/sweep_host.py times chosen functions; this one needs no list of them: it names every
function a phase's time was spent in, including what the sweep never calls by name (imports, the driver, a
library's own work), on the feeding thread (the one that launches the steps) and on each of the others.

The table: per phase and thread, the functions with the most milliseconds inclusive (a function counted once a
sample however deep it recurs; the median over --repeats), and the share of the phase. A thread waiting for the
interpreter's lock is sampled where it waits, so a phase's rows add up to more than its wall time across threads.
The sampler holds that lock itself each millisecond: a 16-lane sweep took ~0.6-0.8 s longer sampled on an H200
host (benchmarks/NOTES.md, issue 30 step 27), so compare its phases with each other, not its wall with a command's.
The sweep must complete every trial before anything is printed.

`--set backend=cpu --set model.hidden=[16]` checks it on any machine (there the workers are processes, and the
command's own thread feeds).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path

# its neighbour: the script's folder is on the path
from sweep_host import COMMAND, headline, profiled_sweeps, records, sweep_arguments, sweep_in_child

# The child: a sampler thread records (seconds since the start, thread, stack id) and the stacks as lists of
# "module:function"; the first and last step's launch times and thread; `dump()` writes them, at the command's end
# (sweep_host.COMMAND runs the command after this, as `mlptrain` runs it).
CHILD = r"""
import os, sys, threading, time, json
T0 = time.perf_counter()
out, interval = os.environ["SWEEP_SAMPLES_OUT"], float(os.environ["SWEEP_SAMPLES_INTERVAL"])
stacks, samples, names, steps, codes = {}, [], {}, [], {}
# a sample whole, or the record: never one while the other is half made
taking, done = threading.Lock(), threading.Event()

def label(code):
    known = codes.get(code)
    if known is None:
        path = code.co_filename.replace(os.sep, "/")
        for marker in ("/site-packages/", "/mlptrain/", "/lib/python3"):
            if marker in path:
                path = ("mlptrain/" if marker == "/mlptrain/" else "") + path.split(marker)[-1]
                path = path.split("/", 1)[1] if marker == "/lib/python3" else path  # the standard library's
                break
        module = path[:-3].replace("/", ".") if path.endswith(".py") else path
        known = codes[code] = f"{module}:{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}"
    return known

def sample():
    me = threading.get_ident()
    while True:
        time.sleep(interval)
        with taking:
            if done.is_set():
                return
            now = time.perf_counter() - T0
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                key = []
                while frame is not None:
                    key.append(label(frame.f_code))
                    frame = frame.f_back
                key = tuple(key)
                tagged = f"{os.getpid()}-{ident}"  # the trainer's threads apart from the command's
                samples.append((now, tagged, stacks.setdefault(key, len(stacks))))
                if tagged not in names:
                    names.update((f"{os.getpid()}-{t.ident}", t.name) for t in threading.enumerate())

def stepped(fn):
    def wrapper(*args, **kwargs):
        steps.append((time.perf_counter() - T0, f"{os.getpid()}-{threading.get_ident()}"))
        return fn(*args, **kwargs)
    return wrapper

def instrument():  # run by COMMAND: at once, or in the trainer only (--trainer)
    import mlptrain.packing.lane_group as lane_group, mlptrain.training.window as window
    # each step a group launches: a flush launches every lane's windows up to their next read (a version before
    # that, one step: its flush)
    name = "_step" if hasattr(lane_group.LaneGroup, "_step") else "flush"
    setattr(lane_group.LaneGroup, name, stepped(getattr(lane_group.LaneGroup, name)))
    window.TrainingWindow.run = stepped(window.TrainingWindow.run)
    threading.Thread(target=sample, name="sampler", daemon=True).start()

def after_fork():  # the trainer (sweep_host.COMMAND): a sampler of its own (threads do not survive a fork)
    global taking, done
    taking, done = threading.Lock(), threading.Event()
    for kept in (stacks, samples, names, steps):
        kept.clear()
    if not TRAINER_ONLY:  # else instrument() starts it
        threading.Thread(target=sample, name="sampler", daemon=True).start()

def dump():
    with taking:
        if done.is_set():
            return
        done.set()
    ordered = sorted(stacks, key=stacks.get)
    with open(out, "w") as file:
        json.dump({"samples": samples, "stacks": ordered, "names": names, "end": time.perf_counter() - T0,
                   "steps": [steps[0], steps[-1]] if steps else []}, file)

"""

# A thread whose innermost frame is one of these waits for work (a pool's queue, a timed wait): not counted.
IDLE = ("threading:Condition.wait", "threading:Event.wait", "queue:Queue.get", "concurrent.futures.thread:_worker",
        "mlptrain.sweep.heartbeats:Heartbeats._run", "mlptrain.run_dirs.event_files:_Writer.run")
# Frames every stack of a thread has (the command line's, a thread's start), not listed.
FRAME = ("<string>:", "typer.", "click.", "mlptrain.cli.__init__:", "threading:Thread.", "concurrent.futures.thread:",
         "contextlib:")
OWN = ("mlptrain.", "optuna.")


def one_sweep(args, folder: Path, name: str) -> dict:
    """One sampled sweep: {"wall_s", "first_step_s", "last_step_s", "end_s", "ms": {phase | thread | function: ms},
    "phase_ms": {phase: wall ms}}; exits on a failed or incomplete sweep."""
    wall, _ = sweep_in_child(args, folder, name, args.epochs, CHILD + COMMAND, "SWEEP_SAMPLES_OUT")
    data, trainer = records(folder, name)
    if trainer is not None:  # its stacks numbered after the command's
        data["samples"] += [(now, ident, stack + len(data["stacks"])) for now, ident, stack in trainer["samples"]]
        data["samples"].sort(key=lambda sample: sample[0])
        data["stacks"] += trainer["stacks"]
        data["names"].update(trainer["names"])
        data["steps"] = trainer["steps"]
    if not data["steps"]:
        sys.exit("WRONG RESULT: no optimizer step was seen")
    (first, feeding), (last, _) = data["steps"]
    stacks = [list(dict.fromkeys(stack)) for stack in data["stacks"]]  # a function once a sample
    idle = [stack[0] in IDLE for stack in stacks]
    # where the time was spent: the innermost frame, after the deepest of the project's own (mlptrain, optuna)
    innermost = [" < ".join(dict.fromkeys([stack[0], next((f for f in stack if f.startswith(OWN)), "-")]))
                 for stack in stacks]
    previous: dict[str, float] = {}
    ms: dict[str, float] = {}
    inner: dict[str, float] = {}
    for now, ident, stack in data["samples"]:
        weight = (now - previous.get(ident, now)) * 1e3
        previous[ident] = now
        if idle[stack]:
            continue
        phase = "start" if now < first else "end" if now > last else "training"
        # a pool's threads as one (util.background names them prefix_0, prefix_1, ...)
        thread = "feeding" if ident == feeding else re.sub(r"_\d+$", "", data["names"].get(str(ident), "?"))
        for function in stacks[stack]:
            if function.startswith(FRAME):
                continue
            key = f"{phase} | {thread} | {function}"
            ms[key] = ms.get(key, 0.0) + weight
        key = f"{phase} | {thread} | {innermost[stack]}"
        inner[key] = inner.get(key, 0.0) + weight
    return {"wall_s": wall, "first_step_s": first, "last_step_s": last, "end_s": data["end"], "ms": ms,
            "innermost": inner,
            "phase_ms": {"start": first * 1e3, "training": (last - first) * 1e3, "end": (data["end"] - last) * 1e3},
            "raw": {**data, "feeding": feeding}}  # every sample, for a timeline drawn afterwards


def main() -> None:
    parser = sweep_arguments(__doc__, "the sweep's flags, e.g. '--pack 16' or ''")  # --json: also every sample
    parser.add_argument("--interval-ms", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=25, help="rows per phase and thread")
    parser.add_argument("--phases", default="start,end", help="which phases' tables to print")
    args = parser.parse_args()
    os.environ["SWEEP_SAMPLES_INTERVAL"] = str(args.interval_ms / 1e3)  # the child's, as sweep_in_child passes it on
    runs, median = profiled_sweeps(args, one_sweep, "sweep-samples-")
    print(f"{headline(args, median)}; sampled every {args.interval_ms:g} ms")
    for table, heading in (("ms", "function (inclusive)"), ("innermost", "innermost frame < the project's deepest")):
        keys = sorted({key for run in runs for key in run[table]})
        rows = [(*key.split(" | "), statistics.median(run[table].get(key, 0.0) for run in runs)) for key in keys]
        print(f"\n| phase | thread | {heading} | ms | share of the phase |\n| --- | --- | --- | --- | --- |")
        for phase in args.phases.split(","):
            wall = statistics.median(run["phase_ms"][phase] for run in runs)
            threads = sorted({row[1] for row in rows if row[0] == phase}, key=lambda t: (t != "feeding", t))
            for thread in threads:
                ranked = sorted((row for row in rows if row[0] == phase and row[1] == thread), key=lambda r: -r[3])
                for _, _, function, value in ranked[:args.top]:
                    print(f"| {phase} | {thread} | {function} | {value:.1f} | {value / max(wall, 1e-9):.0%} |")
    if args.json:
        args.json.write_text(json.dumps({"median": median, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
