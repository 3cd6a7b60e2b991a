"""mlptrain's µs a step under variants of its module constants, the variants alternating: a kernel change
measured against its switch in one call, each variant's rounds interleaved with the others' so that a drift of
the GPU's clocks falls on all of them alike.

Each variant is `name=patches`, the patches `module.NAME=value` separated by `;` (a module of
mlptrain.backends.numba_kernels by its short name, any other by its full one; the value a Python literal); an
empty patch list is the code as it is. Each round runs every variant once, each in a subprocess of
benchmarks/mlp_mnist.py (`--tools mlptrain` and the arguments after `--`) with its constants set first, so every
variant compiles and captures its own kernels. mlp_mnist.py checks each run's loss before it reports a time.
One table: each variant's µs a step per precision, round by round.

    python benchmarks/alternate.py [--rounds 2] base= fused=gemm_narrow.FUSE_INPUT_GRADIENT=True \\
        -- --precisions fp32,bf16 --epochs 4
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROW = re.compile(r"^\| (\w+) \| mlptrain \| [\d.]+ \| ([\d.]+) \|", re.M)


def apply(patches: str) -> None:
    """Set each `module.NAME=value` of `patches`; a NAME the module lacks is an error (a typo measures nothing)."""
    for patch in filter(None, patches.split(";")):
        target, value = patch.split("=", 1)
        module_name, name = target.rsplit(".", 1)
        if not module_name.startswith("mlptrain."):
            module_name = f"mlptrain.backends.numba_kernels.{module_name}"
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            raise SystemExit(f"{module_name} has no {name}")
        setattr(module, name, eval(value, {}))
        print(f"set {module_name}.{name} = {value}", flush=True)


def run_variant(patches: str, benchmark_args: list[str]) -> dict[str, float]:
    """{precision: µs a step} of one mlp_mnist.py run with `patches` set."""
    done = subprocess.run([sys.executable, __file__, "--child", patches, "--", "--tools", "mlptrain",
                           *benchmark_args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"variant {patches!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {precision: float(us) for precision, us in ROW.findall(done.stdout)}


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", help="name=patches")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a variant's own process: set, then run mlp_mnist.py
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv[:split])
    benchmark_args = argv[split + 1:]
    if args.child is not None:
        apply(args.child)
        sys.argv = [str(HERE / "mlp_mnist.py"), *benchmark_args]
        runpy.run_path(str(HERE / "mlp_mnist.py"), run_name="__main__")
        return
    variants = [v.split("=", 1) if "=" in v else (v, "") for v in args.variants]
    if len(variants) < 2 or len({name for name, _ in variants}) < len(variants):
        raise SystemExit("give at least two variants, each name once")
    results: dict[str, dict[str, list[float]]] = {name: {} for name, _ in variants}
    for round_ in range(args.rounds):
        for name, patches in variants:
            for precision, us in run_variant(patches, benchmark_args).items():
                results[name].setdefault(precision, []).append(us)
            print(f"round {round_ + 1} {name}: " +
                  ", ".join(f"{p} {v[-1]:.1f}" for p, v in results[name].items()), flush=True)
    print("\n| variant | precision | µs a step, round by round |")
    print("| --- | --- | --- |")
    for name, by_precision in results.items():
        for precision, values in by_precision.items():
            print(f"| {name} | {precision} | {' / '.join(f'{v:.1f}' for v in values)} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
