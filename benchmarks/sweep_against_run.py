"""A packed sweep of K trials against one trial's run, as a user waits for each: issue 30's "K packed trials in at
most twice one trial's wall time", and where the two differ.

Each round times, as whole processes, `mlptrain sweep` of packed_trials.py's K trials of the job (its learning rates
x as many seeds as needed, `--epochs` each, with `--flags`) and `mlptrain run` of the job's recipe for as many
epochs, each after an untimed one-epoch sweep and run that put its kernels in the cache. `--versions` alternates
the sweep of several copies of the package within each round (each a folder holding an `mlptrain` package, copied
to a folder of its own that is put first on the PYTHONPATH; each round starts with the next one), the run being
the first one's. A machine's sweeps vary by ±0.2 s from round to round (benchmarks/NOTES.md, issue 30 step 30), so
compare versions within one call, round by round.

Every sweep must complete each trial once and every run must learn (its training loss below the job's bound), or
the script exits 1 with nothing printed. The table: each round's walls; then for each version the median sweep
against the median run, the median of its rounds' differences from the first version's, and from the runs' own
summaries (median over the rounds) the seconds to the start of each trial and to its first optimizer step, the
training's seconds and the run's own wall (a sweep's trials: their range).

    python benchmarks/sweep_against_run.py [--job mnist] [--trials 16] [--epochs 10] [--flags "--pack 16"]
                                           [--rounds 4] [--versions name=PATH,...] [--set KEY=VALUE ...] [--json FILE]

`--set backend=cpu --set model.hidden=[64] --epochs 2 --trials 4 --flags "--pack 4" --learned-below 1.5` checks it on
any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # packed_trials.py, its neighbour

import packed_trials  # noqa: E402

PHASES = ("startup_s", "first_step_s", "train_s", "wall_s")  # summary.json's, from the process's start but the last two


def timed(command: list[str], pythonpath: str | None, log: Path) -> float:
    """`python -m mlptrain COMMAND` as a whole process: its wall time; exits 1 where it fails."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mlptrain", *command], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    log.write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"WRONG RESULT: mlptrain {' '.join(command)} exited {done.returncode} (see {log})")
    return wall


def staged(versions: list[tuple[str, str | None]], folder: Path) -> list[tuple[str, str | None]]:
    """Each version's `mlptrain` package copied into a folder of its own (`folder`/NAME), which becomes its
    PYTHONPATH entry: every version then runs from the same layout, the package alone. A checkout's root (its
    tests, benchmarks, data and metadata beside the package) put first on the path took 0.19 s longer to a
    sweep's first step than a copy of the same package, and its training 0.025-0.05 s longer (benchmarks/NOTES.md,
    issue 30 step 34). A version without a path (the installed package) stays as it is."""
    out = []
    for name, path in versions:
        if path is None:
            out.append((name, None))
            continue
        package = Path(path) / "mlptrain"
        if not (package / "__init__.py").is_file():
            raise SystemExit(f"--versions {name}={path}: no mlptrain package there")
        copy = folder / name
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(package, copy / "mlptrain", ignore=shutil.ignore_patterns("__pycache__"))
        out.append((name, str(copy)))
    return out


def summaries(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*/summary.json"))] or \
        [json.loads((folder / "summary.json").read_text())]


def checked_sweep(folder: Path, trials: int, bound: float) -> list[dict]:
    """The sweep's trials' summaries, once each trial completed once and the best one learned."""
    rows = json.loads((folder / "results.json").read_text())["trials"]
    if len(rows) != trials or any(row["state"] != "complete" for row in rows):
        raise SystemExit(f"WRONG RESULT: {folder}: {[(row['params'], row['state']) for row in rows]}")
    found = summaries(folder)
    if min(s["train_loss"] for s in found) >= bound:
        losses = [s["train_loss"] for s in found]
        raise SystemExit(f"WRONG RESULT: {folder}: no trial learned (training losses {losses})")
    return found


def checked_run(folder: Path, bound: float) -> dict:
    summary = summaries(folder)[0]
    if not summary["train_loss"] < bound:
        raise SystemExit(f"WRONG RESULT: {folder}: training loss {summary['train_loss']} (not below {bound})")
    return summary


def spread(key: str, sweeps: list[list[dict]]) -> str:
    """A phase of a sweep's trials: the medians over the sweeps of its lowest and highest trial."""
    low = statistics.median(min(s[key] for s in trials) for trials in sweeps)
    high = statistics.median(max(s[key] for s in trials) for trials in sweeps)
    return f"{low:.3f}" if high - low < 5e-4 else f"{low:.3f}-{high:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=["mnist"], default="mnist")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--flags", default="--pack 16", help="the sweep's flags")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--versions", default="", help="name=PYTHONPATH,... alternated within each round")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for the sweep's trials and the run")
    parser.add_argument("--learned-below", type=float, help="the training loss a run must get below (default: "
                        "the job's, for a GPU's 10 epochs)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/sweep-against-run"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    versions = staged([tuple(v.split("=", 1)) for v in args.versions.split(",") if v] or [("this", None)],
                      args.out / "versions")
    recipe, bound = packed_trials.SWEEP_BASE[args.job], args.learned_below or packed_trials.JOBS[args.job][2]
    sweep_file, seeds, per_seed = packed_trials.sweep_file(args.job, args.trials, args.out)
    trials = seeds * per_seed
    flags = args.flags.split()
    stamp = time.strftime("%H%M%S")

    def sweep(path: str | None, name: str, epochs: int) -> tuple[float, Path]:
        """`mlptrain sweep` of the K trials: its seconds and its folder."""
        folder = args.out / "sweeps" / name
        return timed(["sweep", str(sweep_file), f"train.epochs={epochs}", *args.set, "--runs-dir", str(folder.parent),
                      "--name", name, *flags], path, args.out / f"{name}.log"), folder

    def run(name: str, epochs: int) -> tuple[float, Path]:
        """`mlptrain run` of the recipe with the first version: its seconds and its folder."""
        folder = args.out / "runs" / name
        return timed(["run", recipe, f"train.epochs={epochs}", *args.set, "--runs-dir", str(folder.parent),
                      "--name", name], versions[0][1], args.out / f"{name}.log"), folder

    # untimed and unchecked (one epoch): a package's own digest compiles its kernels once, not in a timed command
    for name, path in versions:
        sweep(path, f"warm-{name}-{stamp}", 1)
    run(f"warm-{stamp}", 1)
    rounds = []
    for r in range(args.rounds):
        done = {}
        # each round starts with the next version, so that no version always runs first, right after a run
        for name, path in versions[r % len(versions):] + versions[:r % len(versions)]:
            wall, folder = sweep(path, f"{name}-{r}-{stamp}", args.epochs)
            done[name] = wall, checked_sweep(folder, trials, bound)
        wall, folder = run(f"run-{r}-{stamp}", args.epochs)
        done["run"] = wall, checked_run(folder, bound)
        rounds.append(done)

    print(f"{trials} trials of {recipe} x {args.epochs} epochs, `mlptrain sweep {args.flags}` against one `mlptrain "
          f"run {recipe}`, {args.rounds} rounds{' ' + ' '.join(args.set) if args.set else ''}")
    print(f"| round | {' | '.join(f'sweep {name} s' for name, _ in versions)} | run s |")
    print(f"| --- | {' | '.join('---' for _ in versions)} | --- |")
    for r, done in enumerate(rounds, 1):
        print(f"| {r} | {' | '.join(f'{done[name][0]:.3f}' for name, _ in versions)} | {done['run'][0]:.3f} |")
    run_median = statistics.median(done["run"][0] for done in rounds)
    first = versions[0][0]
    print(f"\n| | median wall s | x the run | s against {first}, round by round | {' | '.join(PHASES)} |")
    print(f"| --- | --- | --- | --- | {' | '.join('---' for _ in PHASES)} |")
    result = {"trials": trials, "epochs": args.epochs, "flags": args.flags,
              "rounds": [{key: value[0] for key, value in done.items()} for done in rounds], "medians": {},
              "paired": {}}
    for name, _ in versions:
        median = statistics.median(done[name][0] for done in rounds)
        # the median of the rounds' differences: a machine's walls drift over a call more than versions differ
        paired = statistics.median(done[name][0] - done[first][0] for done in rounds)
        phases = [spread(key, [done[name][1] for done in rounds]) for key in PHASES]
        print(f"| sweep {name} | {median:.3f} | {median / run_median:.2f}x | "
              f"{'-' if name == first else f'{paired:+.3f}'} | {' | '.join(phases)} |")
        result["medians"][name], result["paired"][name] = median, paired
    run_phases = [f"{statistics.median(done['run'][1][key] for done in rounds):.3f}" for key in PHASES]
    print(f"| run | {run_median:.3f} | 1.00x | - | {' | '.join(run_phases)} |")
    result["medians"]["run"] = run_median
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
