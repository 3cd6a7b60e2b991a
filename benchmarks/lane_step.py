"""One optimizer step of K packed lanes of adam_mnist (mlptrain.packing.lane_step), timed as a `--pack K` sweep
runs it: each step one replay of the lanes' captured graph.

Builds K trials of packed_trials.py's MNIST job (784-512-512-10, batch 128, Adam, the job's learning rates and
seeds) in lanes of one group, runs --warm windows (the first compiles and captures), then --rounds rounds of
--steps windows, each round between two synchronisations: its wall time over its steps is the GPU's time a step,
since the host queues a replay in a few µs. Before anything is printed, every lane's mean training loss over
the last round must be finite and below its mean over the warm windows, or the script exits 1.

The table: the median and the spread of the rounds' µs a step, and µs a step a lane. With `--profile`, one more
step is launched kernel by kernel between cuProfilerStart and cuProfilerStop, so that
`ncu --profile-from-start off` times that step's kernels alone.

    python benchmarks/lane_step.py [--lanes 16] [--steps 60] [--rounds 5] [--warm 3] [--profile]
                                   [--backend cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # packed_trials.py, its neighbour

import packed_trials  # noqa: E402


def round_losses(group, runs, first: int, steps: int, batch: int) -> list[float]:
    """Each lane's mean training loss over windows [first, first + steps) of its epoch."""
    lo, hi = first * batch, (first + steps) * batch
    return [s.evaluator.read_rows(s.window.row_loss, s.window.row_correct, lo, hi)[0] for s in runs]


def measure(args) -> dict:
    from mlptrain.data.loader import epoch_order

    group, runs = packed_trials.lane_sessions("mnist", args.lanes, 1, backend=args.backend)
    backend, batch = group.backend, runs[0].config.train.batch_size
    windows = runs[0].train.size // batch
    if args.warm < 1 or args.warm + args.rounds * args.steps + args.profile > windows:
        raise SystemExit(f"--warm must be 1 or more, and --warm + --rounds x --steps (+1 with --profile) must fit "
                         f"in an epoch's {windows} windows")
    for s in runs:
        s.window.start_epoch(epoch_order(s.train, s.config.seed, 1))

    def step(i: int) -> None:
        for s in runs:
            s.window.run(i * batch, batch)
        group.flush()

    for i in range(args.warm):
        step(i)
    backend.synchronize()
    per_step, first = [], args.warm
    for r in range(args.rounds):
        began = time.perf_counter()
        for i in range(first + r * args.steps, first + (r + 1) * args.steps):
            step(i)
        backend.synchronize()
        per_step.append((time.perf_counter() - began) / args.steps)
    before = round_losses(group, runs, 0, args.warm, batch)
    after = round_losses(group, runs, first + (args.rounds - 1) * args.steps, args.steps, batch)
    wrong = [k for k, (a, b) in enumerate(zip(before, after)) if not (math.isfinite(b) and b < a)]
    if wrong:
        raise SystemExit(f"WRONG RESULT: lanes {wrong} did not learn (mean loss {before} -> {after})")
    if args.profile:
        from cuda.bindings import driver as cu

        cu.cuProfilerStart()
        group.step.launches(batch)  # kernel by kernel: the step's launches as a capture records them
        backend.synchronize()
        cu.cuProfilerStop()
    return {"lanes": args.lanes, "engine": group.step.engine, "step_us": [t * 1e6 for t in per_step],
            "loss_first": before, "loss_last": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = measure(args)
    us = result["step_us"]
    median = statistics.median(us)
    print(f"\n{args.lanes} lanes of adam_mnist (784-512-512-10, batch 128), GEMMs on {result['engine']}, "
          f"{args.backend}: {args.rounds} rounds of {args.steps} steps")
    print("| µs a step (median) | min | max | µs a step a lane |")
    print("| --- | --- | --- | --- |")
    print(f"| {median:.1f} | {min(us):.1f} | {max(us):.1f} | {median / args.lanes:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
