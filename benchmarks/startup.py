"""Host-side start-up: how long each command takes before it does its work, on any machine (no GPU needed).

    python benchmarks/startup.py [--repeats 7] [--run adam_mnist backend=cpu ...] [--json FILE]

Two measurements, each a fresh process, the median (and min-max) of --repeats, interleaved so that a
shared machine's load falls on every row alike:

- whole processes, wall clock around the subprocess: `python -c pass` (the interpreter's own floor),
  `mlptrain --version`, `mlptrain --help`, `mlptrain configs`;
- `mlptrain run ...` up to its first optimizer step, by phase. The child runs the real command (`main()`
  of mlptrain.cli, as `python -m mlptrain` does) with timers wrapped around the functions each phase
  calls, and exits the moment the first step has been queued (the run directory it leaves is a scratch
  folder's). Times count from just before the harness starts the process, so "first step" is what a
  user waits for from the command.
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

COMMANDS = {"python -c pass": ["-c", "pass"], "mlptrain --version": ["-m", "mlptrain", "--version"],
            "mlptrain --help": ["-m", "mlptrain", "--help"], "mlptrain configs": ["-m", "mlptrain", "configs"]}

# The child: wraps the functions of each phase, then runs the command; prints the absolute times as JSON.
CHILD = r"""
import json, os, sys, time
marks = {}
import mlptrain
marks['package'] = mlptrain.STARTED
import mlptrain.cli
marks['cli imported'] = time.time()
import mlptrain.cli.run as run, mlptrain.config.load as config, mlptrain.training.experiment as experiment
import mlptrain.training.session as session, mlptrain.training.loop as train, mlptrain.training.window as window

def timed(owners, name, label):
    # every module that holds the name (a command may import it at the top or when it runs)
    inner = getattr(owners[0], name)
    def wrapper(*args, **kwargs):
        marks.setdefault(label + ' start', time.time())
        try:
            return inner(*args, **kwargs)
        finally:
            marks.setdefault(label + ' end', time.time())
    for owner in owners:
        if hasattr(owner, name):
            setattr(owner, name, wrapper)

timed([config, run], 'load_config', 'config')
timed([experiment], 'get_backend', 'backend')
timed([experiment], 'load_dataset', 'dataset')
timed([session], 'build_session', 'session')
timed([experiment, run], 'create_run', 'run dir')
timed([train], 'RunLogger', 'tensorboard writer')
step = window.TrainingWindow.run
def first_step(self, *args):
    step(self, *args)
    marks['first step'] = time.time()
    print(json.dumps(marks), flush=True)
    os._exit(0)
window.TrainingWindow.run = first_step
sys.argv = ['mlptrain'] + sys.argv[1:]
mlptrain.cli.main()
raise SystemExit('the run ended before its first step')
"""

PHASES = [  # (label, from mark, to mark)
    ("interpreter (to `import mlptrain`)", "launch", "package"),
    ("imports of the CLI", "package", "cli imported"),
    ("CLI parsing, run's imports, config", "cli imported", "config end"),
    ("backend", "backend start", "backend end"),
    ("dataset (find, verify, decode)", "dataset start", "dataset end"),
    ("session (model, buffers)", "session start", "session end"),
    ("run directory", "session end", "run dir end"),
    ("to the TensorBoard writer", "run dir end", "tensorboard writer start"),
    ("TensorBoard writer", "tensorboard writer start", "tensorboard writer end"),
    ("to the first step, and the step", "tensorboard writer end", "first step"),
    ("FIRST STEP from the command", "launch", "first step"),
]


def whole(args: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"FAILED ({done.returncode}): {args}\n{done.stderr[-2000:]}")
    return seconds


def to_first_step(run_args: list[str], scratch: Path) -> dict[str, float]:
    command = [sys.executable, "-c", CHILD, "run", *run_args, "--runs-dir", str(scratch)]
    launch = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"FAILED ({done.returncode}): {' '.join(run_args)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    marks = {"launch": launch, **json.loads(done.stdout.strip().splitlines()[-1])}
    return {label: marks[b] - marks[a] for label, a, b in PHASES if a in marks and b in marks}


def row(label: str, values: list[float]) -> str:
    return f"| {label} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--run", nargs="*", default=["adam_mnist", "backend=cpu", "train.epochs=1"],
                        help="the arguments of `mlptrain run` (none: skip the run)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="startup-") as scratch:
        for _ in range(args.repeats):
            for label, command in COMMANDS.items():
                times.setdefault(label, []).append(whole(command))
            if args.run:
                for label, seconds in to_first_step(args.run, Path(scratch)).items():
                    times.setdefault(label, []).append(seconds)
    print(f"median of {args.repeats}, seconds; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print("| what | median s | min-max |\n| --- | --- | --- |")
    for label, values in times.items():
        print(row(label, values))
    if args.json:
        args.json.write_text(json.dumps(times, indent=1))


if __name__ == "__main__":
    main()
