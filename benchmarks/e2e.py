"""Whole-process wall time, from the command to its exit: `mlptrain run` with an empty kernel cache (cold)
and a filled one (warm), against the same recipe in PyTorch (benchmarks/torch_recipes.py), all in one run
on one GPU, with each run's test metric beside its time.

    python benchmarks/e2e.py --data DIR [--jobs adam_mnist,autoencoder_cifar10] [--repeats 1] [--json FILE]

Each figure is one fresh process timed by this script (wall clock, perf_counter around the subprocess);
the median of --repeats where more than one. Cold runs get a new, empty MLPTRAIN_KERNEL_CACHE folder
each; warm runs reuse the folder a cold run filled. Every run's result is checked before its time is
reported (MNIST test accuracy >= 0.97; the autoencoder's test MSE below predicting the mean image) and
a failed or wrong run stops the script with a non-zero exit.
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

HERE = Path(__file__).resolve().parent
PEERS = {"adam_mnist": ("eager", "graphs"), "autoencoder_cifar10": ("eager", "channels_last")}


def timed(command, env=None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"FAILED ({done.returncode}): {' '.join(map(str, command))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def check(job: str, result: dict, who: str) -> None:
    if job == "adam_mnist" and not result.get("test_acc", 0) >= 0.97:
        sys.exit(f"WRONG: {who} reached test accuracy {result.get('test_acc')} on {job} (expected >= 0.97)")
    if job == "autoencoder_cifar10":
        bound = result.get("mean_image_mse", 0.06)
        if not result.get("test_mse", 1) < bound:
            sys.exit(f"WRONG: {who} reached test MSE {result.get('test_mse')} on {job} (predicting the mean image: {bound})")


def mlptrain_run(job, data, runs, cache, name) -> tuple[float, dict]:
    command = [sys.executable, "-m", "mlptrain", "run", job, f"data.root={data}", "--runs-dir", str(runs), "--name", name]
    seconds, _ = timed(command, {"MLPTRAIN_KERNEL_CACHE": str(cache)})
    summary = json.loads((runs / name / "summary.json").read_text())
    check(job, summary, f"mlptrain ({name})")
    return seconds, summary


def torch_run(job, data, mode) -> tuple[float, dict]:
    seconds, out = timed([sys.executable, str(HERE / "torch_recipes.py"), job, "--mode", mode, "--data", str(data)])
    result = json.loads(out.strip().splitlines()[-1])
    check(job, result, f"PyTorch {mode}")
    return seconds, result


def metric(job, result) -> str:
    return f"acc {result['test_acc']:.4f}" if job == "adam_mnist" else f"mse {result['test_mse']:.5f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("MLPTRAIN_DATA_DIR", "data")))
    parser.add_argument("--jobs", default="adam_mnist,autoencoder_cifar10")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows, scratch = [], Path(tempfile.mkdtemp(prefix="e2e-"))
    for job in args.jobs.split(","):
        times = {}
        for r in range(args.repeats):
            cache = scratch / f"cache-{job}-{r}"
            for kind in ("cold", "warm"):
                seconds, summary = mlptrain_run(job, args.data, scratch / "runs", cache, f"{job}-{kind}-{r}")
                times.setdefault(f"mlptrain {kind}", []).append((seconds, summary))
            for mode in PEERS[job]:
                times.setdefault(f"PyTorch {mode}", []).append(torch_run(job, args.data, mode))
        for tool, runs in times.items():
            seconds = statistics.median(s for s, _ in runs)
            result = runs[0][1]
            rows.append({"job": job, "tool": tool, "wall_s": seconds, "metric": metric(job, result),
                         **{k: result.get(k) for k in ("startup_s", "compile_s", "kernels_compiled",
                                                       "kernels_from_cache", "first_step_s", "train_s")}})
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n| job | tool | wall s | first step s | compile s | kernels compiled / cached | train s | test |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    for r in rows:
        kernels = "" if r["kernels_compiled"] is None else f"{r['kernels_compiled']} / {r['kernels_from_cache']}"
        print(f"| {r['job']} | {r['tool']} | {r['wall_s']:.1f} | {fmt(r['first_step_s'], '.1f')} | "
              f"{fmt(r['compile_s'], '.1f')} | {kernels} | {fmt(r['train_s'], '.1f')} | {r['metric']} |")


if __name__ == "__main__":
    main()
