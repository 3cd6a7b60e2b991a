"""`--pack auto`: how many runs of one config a worker trains side by side, measured on its GPU once and cached.

The runs' throughput (optimizer steps a second, all of them together) is measured for K = 1, 2, 4, ... runs
stepped as a packed worker steps them (mlptrain.packing.side_by_side: in lanes of one group where the config
allows, mlptrain.packing.lane_group, else in turn, each on a stream of its own): each
builds the config's session, trains two full windows (the first compiles and the second captures its
CUDA graph), then full windows in turn for at least MEASURE_S. K doubles while the runs fit in the GPU's
memory (a session refused for memory ends the search), up to `most` (the trials or seeds there are) and
packing.MAX_PACK; the answer is the smallest K within GAIN of the best rate measured. The measured rates
are kept per GPU model, per what sets a step's cost (the model and its widths, the batch and its
accumulation, precision, optimizer, the dataset's images) and per version of the package's code, in a JSON
file of the user cache folder ($MLPTRAIN_PACK_CACHE, `off` to measure every time); the lr, the schedule and
the seed do not enter it.
On the CPU there is no GPU to share: 1.
"""

from __future__ import annotations

import gc
import hashlib
import json
import threading
import time

import numpy as np

from mlptrain.backends.thread_stream import launch_stream, use_launch_stream
from mlptrain.errors import OutOfMemory
from mlptrain.util.atomic import replacing
from mlptrain.util.console import console
from mlptrain.util.user_paths import cache_folder

AUTO = "auto"
GAIN = 1.1  # the smallest K within 10% of the best throughput measured is chosen
MEASURE_S = 0.25  # seconds of host time a K's timed windows take at least
MIN_ROUNDS = 20
CACHE_ENV = "MLPTRAIN_PACK_CACHE"
_lock = threading.Lock()  # one measurement at a time in a process: a sweep's threads share its answer
_known: dict = {}  # key -> (K, rates): what this process measured or read


def cost_key(config, device_name: str) -> str:
    """What decides a packed step's cost, as one string: the GPU model, the config's shapes and kinds, and the
    package's code (faster kernels, a measurement of their own)."""
    # imported here: the kernel cache's modules are the GPU path's (a CPU run never asks for a key)
    from mlptrain.backends.kernel_cache.cubins import package_digest

    train, data = config.train, config.data
    parts = {"gpu": device_name, "code": package_digest()[:16], "model": _plain(config.model),
             "optim": config.optim.name,
             "batch": train.batch_size, "accumulate": train.grad_accum_steps, "precision": train.precision,
             "graphs": train.cuda_graphs, "data": [data.dataset, data.path, data.image_size]}
    return json.dumps(parts, sort_keys=True, default=str)


def _plain(section) -> dict:
    return {name: value for name, value in vars(section).items() if not name.startswith("_")}


def resolve(pack, config, resources, most: int) -> int:
    """`pack` as a number of runs: itself, or for AUTO the measured K for `config` on `resources`' GPU (printed
    in one line); never more than `most`."""
    if pack != AUTO:
        return pack
    if config.backend == "cpu":
        console.print("--pack auto: 1 on the CPU (there is no GPU for packed runs to share)", highlight=False)
        return 1
    backend, _ = resources.prepare(config)
    if backend.name != "cuda":  # backend auto without a usable GPU
        console.print("--pack auto: 1 (no GPU: the run trains on the CPU)", highlight=False)
        return 1
    key = cost_key(config, backend.device_name)
    # imported here, as in measure
    from mlptrain.packing.side_by_side import MAX_PACK

    limit = min(MAX_PACK, 1 << max(most - 1, 0).bit_length())  # K past the runs there are would not be used
    with _lock:
        found = _known.get(key) or _read(key)
        if found and not _covers(found, limit):  # measured for fewer runs, and still gaining there
            found = None
        source = "cached" if found else "measured"
        if not found:
            console.print(f"--pack auto: measuring how many runs of this config add throughput on "
                          f"{backend.device_name} (once: the answer is cached)", highlight=False, soft_wrap=True)
            found = (*measure(config, resources, limit), limit)
            _write(key, found)
        _known[key] = found
    k, rates, _ = found
    shown = ", ".join(f"{runs}: {rate:,.0f}" for runs, rate in rates.items()) or "none could be timed"
    chosen = max(1, min(k, most))
    console.print(f"--pack auto: {chosen} packed on {backend.device_name} (optimizer steps a second, all "
                  f"runs together: {shown}; {source})", highlight=False, soft_wrap=True)
    return chosen


def _covers(found, limit: int) -> bool:
    """Whether a measurement (K, rates, the largest K it could try) answers for runs up to `limit`: it tried as
    many, or stopped below the largest it could try (more did not fit)."""
    _, rates, searched = found
    return searched >= limit or max(rates, default=1) < searched


def measure(config, resources, largest: int | None = None) -> tuple[int, dict]:
    """(K, {runs: steps a second}) for `config` on `resources`' GPU (see the module's docstring), trying K up to
    `largest` (default and at most packing.MAX_PACK)."""
    # imported here: packing's callers import this module, and the session pulls in the model and optimizers
    from mlptrain.packing.side_by_side import MAX_PACK

    home = launch_stream()  # each backend made here switches the thread to its stream: the caller's comes back
    try:
        return _search(config, resources, min(largest or MAX_PACK, MAX_PACK))
    finally:
        use_launch_stream(home)


def _search(config, resources, largest: int) -> tuple[int, dict]:
    """Every K = 1, 2, 4, ... up to `largest` that fits, then the smallest whose rate is within GAIN of the best:
    in lanes a few runs may gain little (2 lanes of an MLP: +8%) where 16 gain threefold, so no K is skipped
    for the doubling before it."""
    rates, k = {}, 1
    while k <= largest:
        try:
            rate = _rate(config, resources, k)
        except OutOfMemory:
            break
        if rate is None:  # no full window to time: the data is smaller than a batch
            break
        rates[k] = rate
        k *= 2
    best = max(rates.values(), default=0.0)
    return min((runs for runs, rate in rates.items() if rate * GAIN >= best), default=1), rates


def _rate(config, resources, k: int) -> float | None:
    """Optimizer steps a second of k sessions of `config` stepped as a packed worker steps them (in lanes of one
    group where the config allows, else in turn, each on a stream of its own); None where its data holds no
    full window."""
    # imported here: building a session pulls in the model, optimizers and data splits
    from mlptrain.packing.lane_group import slots

    sessions, streams = [], []
    try:
        with console.capture():  # k sessions' build notes (a validation split's, say) would repeat k times
            group, views = slots(config, resources, k)
            for view in views:
                with view.allocating():
                    sessions.append(view.session(config))
                streams.append(launch_stream())  # the stream its backend made
            rows = sessions[0].window.full_rows
            windows = sessions[0].train.size // rows
            if windows == 0:
                return None
            order = np.arange(sessions[0].train.size, dtype=np.int32)
            for session in sessions:
                session.window.start_epoch(order)

            def window(w: int) -> None:  # every session's window w
                for session, stream in zip(sessions, streams):
                    use_launch_stream(stream)
                    session.window.run((w % windows) * rows, rows)
                if group is not None:
                    group.flush()

            for w in range(2):  # launches one by one (compiling), then the graph's capture
                window(w)
            for session in sessions:
                session.backend.synchronize()
            began, rounds = time.perf_counter(), 0
            while rounds < MIN_ROUNDS or time.perf_counter() - began < MEASURE_S:
                window(rounds + 2)
                rounds += 1
            for session in sessions:
                session.backend.synchronize()
            return k * rounds / (time.perf_counter() - began)
    finally:
        sessions.clear()
        gc.collect()  # their device buffers go back before the real runs allocate theirs


def _cache_file():
    folder = cache_folder(CACHE_ENV, "pack")
    return None if folder is None else folder / "auto.json"


def _entries() -> dict:
    path = _cache_file()
    try:
        entries = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):  # none yet, or unreadable: measured again
        return {}
    return entries if isinstance(entries, dict) else {}


def _read(key: str):
    entry = _entries().get(hashlib.sha256(key.encode()).hexdigest()[:24])
    try:
        return (int(entry["k"]), {int(runs): float(rate) for runs, rate in entry["rates"].items()},
                int(entry.get("searched", 64)))
    except (TypeError, KeyError, ValueError):
        return None


def _write(key: str, found) -> None:
    path = _cache_file()
    if path is None:
        return
    k, rates, searched = found
    entries = _entries()
    entries[hashlib.sha256(key.encode()).hexdigest()[:24]] = {"k": k, "rates": rates, "searched": searched,
                                                              "what": json.loads(key)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path, binary=False, durable=False) as out:
            json.dump(entries, out, indent=1)
    except OSError as err:  # a cache that cannot be written: measured again next time
        console.print(f"[bold yellow]warning:[/] --pack auto: could not cache the measurement in {path} ({err})",
                      highlight=False)
