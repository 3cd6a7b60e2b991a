"""Sweeps on every GPU of the machine: wall time of `mlptrain sweep --workers K` for K = 1, 2, 4, beside
how busy each GPU was, with every trial checked to have run exactly once.

Workloads (grids over `seed`, so every trial costs the same and every point is distinct):

    ae16    autoencoder_cifar10, 16 trials x 8 epochs
    ae4     autoencoder_cifar10,  4 trials x 8 epochs
    mnist8  adam_mnist,           8 trials x 3 epochs
    shared  mnist8 as two `--workers 1` commands at once, one per GPU (CUDA_VISIBLE_DEVICES), sharing one
            study through `--storage`: the way several machines share a sweep

Each sweep is a whole process, timed from its start to its exit. nvidia-smi samples each GPU's
utilisation every second meanwhile. From the study's own timestamps: the seconds from the command to
its first trial's start, and from its last trial's end to its exit. A one-worker sweep's fixed cost is its wall time minus the sum of
its trials' own `wall_s` (summary.json: from building the trial's session to its summary); with
several workers the trials overlap and the column shows only their sum. Before
anything is timed the kernel cache is filled (`mlptrain warmup` of both recipes), and a sweep whose
trials did not each run exactly once, or did not all complete, stops the script with exit code 1.

The peer (`--peer`, the default where PyTorch is installed) runs each workload after mlptrain, with the
same number of workers, as a PyTorch user would: an Optuna study in a journal file and one process per
worker over the GPUs, training the PyTorch recipes of benchmarks/torch_recipes.py (the MLP's step in one
CUDA graph; the autoencoder channels_last with cuDNN autotuning and fused Adam): benchmarks/sweep_peer.py.
Its trials' own seconds are their training, evaluation included, inside each worker.

    python benchmarks/sweep_gpus.py [--package DIR] [--workloads ae16,ae4,mnist8,shared]
                                    [--workers 1,2,4] [--set KEY=VALUE ...] [--json FILE] [--no-peer]

`--package DIR` runs the mlptrain found in DIR (a checkout's root) instead of this one: the same
script measures an older version beside the current one. `--set` adds overrides to every sweep
(`--set backend=cpu model.hidden=[16]` tries the script on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

HERE = Path(__file__).resolve().parent
PEER = "PyTorch + Optuna"  # benchmarks/sweep_peer.py
WORKLOADS = {  # name: (base config, trials, epochs)
    "ae16": ("autoencoder_cifar10", 16, 8),
    "ae4": ("autoencoder_cifar10", 4, 8),
    "mnist8": ("adam_mnist", 8, 3),
}


def sweep_file(folder: Path, base: str, trials: int, epochs: int) -> Path:
    path = folder / f"{base}-{trials}x{epochs}.yaml"
    path.write_text(yaml.safe_dump({"base": base, "method": "grid", "metric": "val_mse" if "autoencoder" in base
                                    else "val_acc", "direction": "minimize" if "autoencoder" in base else "maximize",
                                    "parameters": {"seed": list(range(trials))}}, sort_keys=False))
    return path


class GpuSampler:
    """nvidia-smi's utilisation of every GPU, once a second, into a file; `busy(start, end)` reads it back."""

    def __init__(self, folder: Path):
        self.path = folder / "nvidia-smi.csv"
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "1000"], stdout=open(self.path, "w"), stderr=subprocess.DEVNULL)

    def samples(self) -> list[tuple[float, int, int]]:
        rows = []
        for line in self.path.read_text().splitlines() if self.path.exists() else []:
            try:
                stamp, index, util = (part.strip() for part in line.split(","))
                when = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S"))
                rows.append((when + float("0." + stamp.split(".")[1]) if "." in stamp else when, int(index), int(util)))
            except ValueError:
                continue
        return rows

    def busy(self, start: float, end: float) -> str:
        """Mean utilisation of each GPU over [start, end], e.g. '71% / 68%'."""
        per_gpu: dict[int, list[int]] = {}
        for when, index, util in self.samples():
            if start <= when <= end:
                per_gpu.setdefault(index, []).append(util)
        return " / ".join(f"{statistics.mean(v):.0f}%" for _, v in sorted(per_gpu.items())) or "-"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


def mlptrain(package: Path, *args, env=None, log: Path) -> subprocess.Popen:
    environment = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
        [str(package), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen([sys.executable, "-m", "mlptrain", *args], env=environment, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, cwd=package)


def check_once(sweep_dir: Path, trials: int) -> tuple[float, dict]:
    """Exit 1 unless every seed ran once and completed; returns the sum of the trials' wall_s and each seed's
    value of the sweep's metric."""
    results = json.loads((sweep_dir / "results.json").read_text())
    rows = results["trials"]
    seeds = sorted(row["params"]["seed"] for row in rows)
    folders = sorted(p.name for p in sweep_dir.glob("trial-*"))
    problems = []
    if seeds != list(range(trials)):
        problems.append(f"seeds run {seeds}")
    if len(folders) != trials:
        problems.append(f"{len(folders)} trial folders for {trials} trials: {folders}")
    if any(row["state"] != "complete" for row in rows):
        problems.append("states " + ", ".join(sorted({row["state"] for row in rows})))
    if problems:
        raise SystemExit(f"WRONG RESULT: {sweep_dir}: " + "; ".join(problems) + "; nothing is reported")
    wall = sum(json.loads((sweep_dir / folder / "summary.json").read_text())["wall_s"] for folder in folders)
    return wall, {row["params"]["seed"]: row["value"] for row in rows}


def timeline(sweep_dir: Path, study_name: str, start: float, end: float, shared_db: Path | None = None) -> dict:
    """From the study's own clock: seconds from the command's start to its first trial's start, and from its
    last trial's end to the command's exit. The study is the sweep folder's journal, or a database: the
    shared workload's, or the study.db of a version before the journal (--package)."""
    journal = sweep_dir / "study.journal"
    storage = (JournalStorage(JournalFileBackend(str(journal))) if shared_db is None and journal.exists()
               else f"sqlite:///{shared_db or sweep_dir / 'study.db'}")
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials()
    first = min(t.datetime_start for t in trials).timestamp()  # local time, as Optuna keeps it
    last = max(t.datetime_complete for t in trials).timestamp()
    # each trial's (start, end) from the command's start, and the process that ran it
    each = [[t.number, round(t.datetime_start.timestamp() - start, 3), round(t.datetime_complete.timestamp() - start, 3),
             (t.system_attrs.get("mlptrain:worker") or {}).get("pid")] for t in trials]
    return {"to_first_trial_s": round(first - start, 2), "after_last_trial_s": round(end - last, 2), "each": each}


def run_sweep(package: Path, scratch: Path, workload: str, workers: int, sampler: GpuSampler,
              overrides: list[str]) -> dict:
    base, trials, epochs = WORKLOADS["mnist8" if workload == "shared" else workload]
    path = sweep_file(scratch, base, trials, epochs)
    name = f"{workload}-w{workers}"
    runs = scratch / "runs"
    common = [str(path), f"train.epochs={epochs}", *overrides, "--runs-dir", str(runs), "--name", name]
    start = time.time()
    if workload == "shared":  # two commands, one per GPU, one study: as two machines would share it
        url = f"sqlite:///{scratch / (name + '.db')}"
        procs = [mlptrain(package, "sweep", *common, "--storage", url, env={"CUDA_VISIBLE_DEVICES": str(gpu)},
                          log=scratch / f"{name}-{gpu}.log") for gpu in (0, 1)]
    else:
        procs = [mlptrain(package, "sweep", *common, "--workers", str(workers), log=scratch / f"{name}.log")]
    codes = [p.wait() for p in procs]
    wall = time.time() - start
    if any(codes):
        raise SystemExit(f"WRONG RESULT: {name} exited with {codes}; see {scratch}")
    trained, values = check_once(runs / name, trials)
    shared_db = scratch / f"{name}.db" if workload == "shared" else None
    return {**timeline(runs / name, name, start, start + wall, shared_db), "who": "mlptrain", "workload": workload, "workers": 2 if workload == "shared" else workers, "trials": trials,
            "epochs": epochs, "wall_s": round(wall, 2), "trials_wall_s": round(trained, 2),
            "fixed_s": round(wall - trained, 2), "gpus": sampler.busy(start, start + wall), "values": values}


def run_peer(scratch: Path, workload: str, workers: int, sampler: GpuSampler) -> dict:
    """The same sweep in PyTorch with Optuna, `workers` processes over the GPUs (benchmarks/sweep_peer.py),
    timed the same way: from the launch to the exit."""
    base, trials, epochs = WORKLOADS[workload]
    study = scratch / f"peer-{workload}-w{workers}.journal"
    command = [sys.executable, str(HERE / "sweep_peer.py"), "--job", base, "--trials", str(trials), "--epochs",
               str(epochs), "--workers", str(workers), "--data", os.environ["MLPTRAIN_DATA_DIR"], "--study", str(study)]
    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.time() - start
    if done.returncode:
        raise SystemExit(f"WRONG RESULT: the peer's {workload} with {workers} workers: {done.stderr[-3000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    return {"who": PEER, "workload": workload, "workers": workers, "trials": trials, "epochs": epochs,
            "to_first_trial_s": round(result["first_start"] - start, 2),
            "after_last_trial_s": round(start + wall - result["last_end"], 2), "wall_s": round(wall, 2),
            "trials_wall_s": round(result["train_s"], 2), "fixed_s": round(wall - result["train_s"], 2),
            "gpus": sampler.busy(start, start + wall), "values": result["values"]}


def check_same_values(rows: list[dict]) -> None:
    """Exit 1 unless each seed's metric is the same, bit for bit, however many workers (threads, streams,
    GPUs) trained it: training is deterministic, so any difference is a bug in running trials at once."""
    rows = [r for r in rows if r.get("who", "mlptrain") == "mlptrain"]
    base, trials = WORKLOADS["mnist8" if rows[-1]["workload"] == "shared" else rows[-1]["workload"]][0], rows[-1]
    first = next(r for r in rows if WORKLOADS["mnist8" if r["workload"] == "shared" else r["workload"]][0] == base
                 and r["epochs"] == trials["epochs"])
    differ = {seed: (first["values"][seed], value) for seed, value in trials["values"].items()
              if first["values"].get(seed, value) != value}
    if differ:
        raise SystemExit(f"WRONG RESULT: {trials['workload']} with {trials['workers']} workers trained differently "
                         f"from {first['workload']} with {first['workers']}: seed: (then, now) {differ}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", type=Path, default=HERE.parent)
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=["ae16", "ae4", "mnist8", "shared"])
    parser.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--set", nargs="*", default=[], dest="overrides")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=find_spec("torch") is not None,
                        help="also the PyTorch + Optuna peer (default: where PyTorch is installed)")
    args = parser.parse_args()
    package = args.package.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="sweep-gpus-"))
    for base in sorted({WORKLOADS[w][0] for w in args.workloads if w in WORKLOADS} | {"adam_mnist"}):
        if mlptrain(package, "warmup", base, *args.overrides, log=scratch / f"warmup-{base}.log").wait():
            raise SystemExit(f"mlptrain warmup {base} failed; see {scratch}")
    sampler = GpuSampler(scratch)
    rows = []
    try:
        for workload in args.workloads:
            for workers in ([2] if workload == "shared" else args.workers):
                rows.append(run_sweep(package, scratch, workload, workers, sampler, args.overrides))
                print(json.dumps(rows[-1]), flush=True)
                check_same_values(rows)
                if args.peer and workload in WORKLOADS:
                    rows.append(run_peer(scratch, workload, workers, sampler))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        sampler.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    one = {(r["who"], r["workload"]): r["wall_s"] for r in rows if r["workers"] == 1}
    print(f"\nmlptrain at {package}; scratch {scratch}")
    print("| who | workload | workers | wall s | speed-up vs 1 worker | trials' own s | fixed cost s | to first trial s | "
          "after last trial s | GPU util (mean, per GPU) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fixed = f"{r['fixed_s']:.1f}" if r["workers"] == 1 else "-"
        base = one.get((r["who"], "mnist8" if r["workload"] == "shared" else r["workload"]))
        speed = f"{base / r['wall_s']:.2f}x" if base else "-"
        label = f"{r['workload']} ({r['trials']} x {r['epochs']} epochs)"
        print(f"| {r['who']} | {label} | {r['workers']}{' (2 commands)' if r['workload'] == 'shared' else ''} | {r['wall_s']:.1f} | "
              f"{speed} | {r['trials_wall_s']:.1f} | {fixed} | {r['to_first_trial_s']:.1f} | {r['after_last_trial_s']:.1f} | "
              f"{r['gpus']} |")


if __name__ == "__main__":
    main()
