"""Does mlptrain reach PyTorch's quality on the same recipe? Both tools over several seeds, with 95% CIs.

For each job (`adam_mnist`: test accuracy; `autoencoder_cifar10`: test MSE), mlptrain trains every seed
in one process (`python -m mlptrain run JOB --seeds N`, the built-in config with its default
`model.init`) and PyTorch trains the same recipe once per seed (`benchmarks/torch_recipes.py JOB --seed S`:
same split, schedule, epochs and batch, PyTorch's default initialisation). The table shows each tool's
mean +- 95% CI (Student t over the seeds), every seed's value, and mlptrain minus PyTorch with Welch's
95% CI, then whether mlptrain's mean meets the targets: at least as good as PyTorch's, and the
autoencoder's at or below 0.0040 on the CIFAR-10 subset.

    python benchmarks/quality.py --data DIR [--seeds 3] [--json FILE] [--jobs adam_mnist,autoencoder_cifar10]
    python benchmarks/quality.py --data DIR --tools mlptrain --set backend=cpu --set train.epochs=1  # a CPU check

Any run that fails, and any result that is absurd (not a finite number; MNIST accuracy under 0.9, below
what logistic regression reaches; an autoencoder no better than predicting the mean training image),
stops the script with a message and exit code 1. `--set KEY=VALUE` changes mlptrain's recipe and is
only allowed with `--tools mlptrain` (PyTorch's recipe is fixed, so the comparison would not be one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # mlptrain.seeds.statistics, when run from a checkout without an install

from mlptrain.seeds.statistics import decimals, spread, welch  # noqa: E402

METRIC = {"adam_mnist": "test_acc", "autoencoder_cifar10": "test_mse"}
TOOLS = ("mlptrain", "pytorch")
MSE_TARGET = 0.0040  # the autoencoder's test MSE on the CIFAR-10 subset the issue asks for
MEAN_IMAGE_MSE = 0.06  # about what predicting the mean training image scores on CIFAR-10 (mlptrain records it)


class Failed(Exception):
    """A run failed or its result is absurd: the script stops with this message."""


def run(command: list[str], what: str) -> str:
    """stdout of `command`; raises Failed with the tail of its output when it exits non-zero."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    print(f"{what}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    if done.returncode != 0:
        raise Failed(f"{what} exited {done.returncode}: {' '.join(command)}\n{done.stdout[-2000:]}\n"
                     f"{done.stderr[-3000:]}")
    return done.stdout


def check_value(job: str, value, who: str, bound: float = MEAN_IMAGE_MSE) -> float:
    """`value` as a float, or Failed when it is not a finite number or is absurd for `job`."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise Failed(f"{who}: {METRIC[job]} is {value!r}, not a finite number")
    if job == "adam_mnist" and not 0.9 <= value <= 1.0:
        raise Failed(f"{who}: test accuracy {value} on MNIST is absurd (logistic regression reaches 0.92)")
    if job == "autoencoder_cifar10" and not 0.0 < value < bound:
        raise Failed(f"{who}: test MSE {value} is absurd (predicting the mean training image scores {bound:.4f})")
    return float(value)


def mlptrain_values(job: str, seeds: int, data: Path, runs: Path, settings: list[str]) -> list[float]:
    """The job's metric for seeds 0..seeds-1, from one `mlptrain run --seeds` process."""
    backend = [] if any(s.startswith("backend=") for s in settings) else ["backend=cuda"]
    run([sys.executable, "-m", "mlptrain", "run", job, f"data.root={data}", *backend, *settings,
         "--seeds", str(seeds), "--runs-dir", str(runs), "--name", job], f"mlptrain {job} ({seeds} seeds)")
    record = json.loads((runs / job / "seeds.json").read_text())
    values = record["metrics"].get(METRIC[job], {}).get("values")
    if record.get("seeds") != list(range(seeds)) or not isinstance(values, list) or len(values) != seeds:
        raise Failed(f"mlptrain {job}: seeds.json holds {record.get('seeds')} and {values}, not {seeds} seeds")
    bound = json.loads((runs / job / "seed-0" / "summary.json").read_text()).get("mean_image_mse", MEAN_IMAGE_MSE)
    return [check_value(job, v, f"mlptrain {job} seed {i}", bound) for i, v in enumerate(values)]


def pytorch_values(job: str, seeds: int, data: Path) -> list[float]:
    """The job's metric for seeds 0..seeds-1, one torch_recipes.py process each."""
    values = []
    for seed in range(seeds):
        out = run([sys.executable, str(HERE / "torch_recipes.py"), job, "--data", str(data), "--seed", str(seed)],
                  f"PyTorch {job} seed {seed}")
        values.append(check_value(job, parse_result(out, f"PyTorch {job} seed {seed}").get(METRIC[job]),
                                  f"PyTorch {job} seed {seed}"))
    return values


def parse_result(stdout: str, who: str) -> dict:
    """The JSON object on the last non-empty line of a torch_recipes.py process."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise Failed(f"{who}: no JSON result line in its output: {stdout[-500:]!r}") from None
    if not isinstance(result, dict):
        raise Failed(f"{who}: its result line is not a JSON object: {lines[-1][:200]!r}")
    return result


def job_report(job: str, values: dict[str, list[float]]) -> dict:
    """Each tool's spread and, with both, mlptrain minus PyTorch (Welch) and the targets."""
    out = {"metric": METRIC[job], "higher_is_better": job == "adam_mnist"}
    for tool, tool_values in values.items():
        s = spread(tool_values)
        out[tool] = {"values": tool_values, "mean": s.mean, "std": s.std, "half_width": s.half_width}
    if set(values) == set(TOOLS):
        d = welch(spread(values["pytorch"]), spread(values["mlptrain"]))
        out["difference"] = {"mlptrain_minus_pytorch": d.delta, "half_width": d.half_width, "df": d.df}
        mine, theirs = out["mlptrain"]["mean"], out["pytorch"]["mean"]
        out["targets"] = {"at_least_pytorch": mine >= theirs if job == "adam_mnist" else mine <= theirs}
    if job == "autoencoder_cifar10" and "mlptrain" in values:
        out.setdefault("targets", {})["mse_at_most_0.0040"] = out["mlptrain"]["mean"] <= MSE_TARGET
    return out


def table_lines(reports: dict[str, dict]) -> list[str]:
    lines = [f"{'job':<20} {'tool':<9} {'metric':<9} {'mean ± 95% CI':<20} values"]
    for job, r in reports.items():
        for tool in TOOLS:
            if tool not in r:
                continue
            t = r[tool]
            d = decimals(t["half_width"])
            mean = f"{t['mean']:.{d}f} ± {t['half_width']:.{d}f}" if t["half_width"] is not None else f"{t['mean']:.5f}"
            values = " ".join(f"{v:.{decimals(t['std'])}f}" for v in t["values"])  # as precise as the spread
            lines.append(f"{job:<20} {tool:<9} {r['metric']:<9} {mean:<20} {values}")
        if "difference" in r:
            diff = r["difference"]
            if diff["half_width"] is None:
                lines.append(f"{'':<20} mlptrain - PyTorch: {diff['mlptrain_minus_pytorch']:+.5f} (one seed: no CI)")
            else:
                d = decimals(diff["half_width"])
                lines.append(f"{'':<20} mlptrain - PyTorch: {diff['mlptrain_minus_pytorch']:+.{d}f} ± "
                             f"{diff['half_width']:.{d}f} (Welch, 95%)")
        for target, met in r.get("targets", {}).items():
            lines.append(f"{'':<20} target {target}: {'met' if met else 'NOT met'}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("MLPTRAIN_DATA_DIR", "data")))
    parser.add_argument("--seeds", type=int, default=3, help="seeds per tool and job (default 3; at least 2)")
    parser.add_argument("--jobs", default=",".join(METRIC))
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="mlptrain override")
    parser.add_argument("--runs-dir", type=Path, default=None, help="where mlptrain's runs go (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    jobs, tools = args.jobs.split(","), args.tools.split(",")
    for name, given, valid in (("--jobs", jobs, METRIC), ("--tools", tools, TOOLS)):
        if not given or any(g not in valid for g in given):
            parser.error(f"{name} {','.join(given)}: choose from {','.join(valid)}")
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 (a confidence interval needs two values)")
    if args.set and "pytorch" in tools:
        parser.error("--set changes mlptrain's recipe only; with PyTorch in --tools the two would differ")
    runs = args.runs_dir or Path(tempfile.mkdtemp(prefix="quality-"))
    started, reports = time.perf_counter(), {}
    try:
        for job in jobs:
            values = {}
            if "mlptrain" in tools:
                values["mlptrain"] = mlptrain_values(job, args.seeds, args.data, runs, args.set)
            if "pytorch" in tools:
                values["pytorch"] = pytorch_values(job, args.seeds, args.data)
            reports[job] = job_report(job, values)
    except Failed as err:
        print(f"FAILED: {err}", file=sys.stderr)
        return 1
    print("\n".join(table_lines(reports)))
    print(f"{args.seeds} seeds per tool; {time.perf_counter() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"seeds": args.seeds, "settings": args.set, "jobs": reports,
                                         "wall_s": time.perf_counter() - started}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
