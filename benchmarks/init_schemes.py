"""Which `model.init` trains best: each scheme over several seeds of the same recipe, with 95% CIs.

For each weight/bias scheme this runs `python -m mlptrain run CONFIG --seeds N model.init.weights=W
model.init.biases=B [KEY=VALUE ...]` in its own process (one after another), then prints
`mlptrain compare` over them, the first scheme as the baseline: each final metric's mean +- 95% CI and
every scheme's difference from the first (Welch). The default of each model was chosen from this
(README.md, "Initialisation").

    python benchmarks/init_schemes.py adam_mnist --seeds 3 train.epochs=1 backend=cpu
    python benchmarks/init_schemes.py autoencoder_cifar10 --seeds 3              # the full recipe, on a GPU
    python benchmarks/init_schemes.py autoencoder_cifar10 --schemes pytorch/pytorch,he_uniform/zeros

Runs go to --runs-dir (default: a new temporary folder), one seeds directory per scheme.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEMES = ("pytorch/pytorch", "pytorch/zeros", "he_uniform/zeros", "he_normal/zeros", "glorot_uniform/zeros")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a built-in config name or a YAML file")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run")
    parser.add_argument("--seeds", default="3", help="as `mlptrain run --seeds` (default 3)")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="WEIGHTS/BIASES,... (default: %(default)s)")
    parser.add_argument("--runs-dir", type=Path, default=None)
    args = parser.parse_intermixed_args()
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="init-schemes-"))
    groups = []
    for scheme in args.schemes.split(","):
        weights, _, biases = scheme.partition("/")
        name = f"{weights}-{biases or 'default'}"
        command = [sys.executable, "-m", "mlptrain", "run", args.config, *args.overrides,
                   f"model.init.weights={weights}", *([f"model.init.biases={biases}"] if biases else []),
                   "--seeds", args.seeds, "--runs-dir", str(runs_dir), "--name", name]
        t0 = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            print(f"{scheme}: mlptrain exited {done.returncode}:\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        print(f"{scheme}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        groups.append(str(runs_dir / name))
    return subprocess.run([sys.executable, "-m", "mlptrain", "compare", *groups]).returncode


if __name__ == "__main__":
    sys.exit(main())
