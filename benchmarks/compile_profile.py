"""Where a cold start's compile time goes: every kernel a config needs, compiled one by one in this
process (no disk cache), its seconds and name; then numba's compile pipeline of the slowest one split
by phase (cProfile, cumulative seconds of the functions that matter).

    python benchmarks/compile_profile.py adam_mnist [KEY=VALUE ...] [--profile-top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--profile-top", type=int, default=25)
    args = parser.parse_args()

    from mlptrain.backends.kernel_cache import cache as kernel_cache
    from mlptrain.cli.configs import resolve_config
    from mlptrain.config.load import load_config
    from mlptrain.training.compilation import plan_launches
    from mlptrain.training.experiment import Resources
    from mlptrain.training.session import build_session

    kernel_cache.use_store(None)
    config = load_config(resolve_config(args.config), ["backend=cuda", *args.overrides])
    backend, dataset = Resources().prepare(config)
    session = build_session(config, backend, dataset)
    plan = plan_launches(session)
    timings = []
    for k, types in plan.numba_launches():
        started = time.perf_counter()
        k.dispatcher.compile(types)
        timings.append((time.perf_counter() - started, k.dispatcher.py_func.__qualname__, types))
    timings.sort(reverse=True)
    print(f"{len(timings)} kernels, {sum(t for t, _, _ in timings):.1f} s in all")
    for seconds, name, _ in timings:
        print(f"{seconds:7.2f} s  {name}")
    _, name, types = timings[0]
    slowest = next(k for k, t in plan.numba_launches() if t == types and k.dispatcher.py_func.__qualname__ == name)
    from numba.cuda.dispatcher import CUDADispatcher

    fresh = CUDADispatcher(slowest.dispatcher.py_func, targetoptions=dict(slowest.dispatcher.targetoptions))
    profile = cProfile.Profile()
    profile.runcall(fresh.compile, types)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile_top)


if __name__ == "__main__":
    main()
