"""Compiled kernels cached on disk, and what a run needs compiled up front, in parallel.

Every kernel of the package is declared with `@kernels.jit` (with cuda.jit's options) instead
of `@cuda.jit` (kernels.py). On a GPU its numba dispatcher gets a `DiskCache`: when numba-cuda needs a version of the
kernel for new argument types it asks the cache first (numba-cuda's own per-dispatcher cache
protocol, `load_overload` / `save_overload`), and stores what it compiled (PTX and cubin). An
entry's key digests everything that decides the machine code: the kernel's fingerprint (bytecode,
captured specialisation values, every device function it reaches; see fingerprint.py), the
argument types, the jit options, numba's and numba-cuda's versions, Python's, the GPU's compute
capability and the codegen settings. Different configs that share shapes and dtypes share kernels.

A first run is fast too: `kernels.planning()` records the launches a training window and an evaluation
would make without running them, and `compile_ahead` compiles the missing ones in worker processes
(numba holds one compiler lock per process) that write the cache, then loads them all. `STATS`
counts what this process compiled and loaded, for summary.json. numba is imported only by the calls that
need it: a process whose kernels are all in the driver's index (cubins.py) never calls them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import threading
import time
from dataclasses import asdict, dataclass

from mlptrain.backends.kernel_cache.fingerprint import Unfingerprintable, fingerprint
from mlptrain.backends.kernel_cache.numba_names import LAUNCH_ENV, SIMULATOR
from mlptrain.backends.kernel_cache.store import KernelStore, default_dir, warn

MAX_WORKERS = 16  # each worker holds a CUDA context (~0.5 GB of GPU memory) while it compiles
WORKER_GPU_BYTES = 2**30  # free GPU memory kept per worker, so workers never crowd out the run itself
MIN_PARALLEL = 3  # below this many kernels to compile, a worker's start-up (~2 s) does not pay


@dataclass
class Stats:
    """What this process did with kernels: compiled (and how long that took), loaded from the
    cache, compiled without caching, and the workers that compiled ahead."""

    compiled: int = 0
    from_cache: int = 0
    not_cached: int = 0
    compile_s: float = 0.0
    load_s: float = 0.0
    from_index: int = 0  # cubins the driver loaded from the index (cubins.py), numba not involved
    numba_launches: int = 0  # launches the driver path left to numba (arguments it cannot pass)
    compiled_ahead: int = 0
    ahead_s: float = 0.0
    workers: int = 0
    slowest_s: float = 0.0  # the longest one kernel took in a worker: what the parallel phase cannot beat
    slowest: str = ""
    parallel_error: str = ""  # why compiling in worker processes failed, if it did (then compiled here)

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


STATS = Stats()
_state = {"store": None, "pool": None}
_compiling = threading.Lock()  # one compile_ahead at a time: a second waits, then finds the first's kernels


def store() -> KernelStore:
    """The process's kernel store (the default folder unless `use_store` chose another)."""
    if _state["store"] is None:
        _state["store"] = KernelStore(default_dir())
    return _state["store"]


def use_store(root) -> KernelStore:
    """Use the folder `root` (None: no disk cache) from now on."""
    _state["store"] = KernelStore(root)
    return _state["store"]


def environment() -> tuple:
    """What besides the kernel itself changes its machine code: the current GPU's kind (a sweep's threads
    may run on several) and the process's settings."""
    # imported on first use: numba takes seconds to import, and a process with every kernel indexed never needs it
    from numba import cuda

    return _environment(tuple(cuda.get_current_device().compute_capability))


@functools.cache
def _environment(capability: tuple) -> tuple:
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from importlib.metadata import version

    import numba
    from numba import config

    try:
        numba_cuda = version("numba-cuda")
    except Exception:  # an unusual install: the version then stays out of the key, numba's is in
        numba_cuda = "unknown"
    flags = tuple((name, repr(getattr(config, name, None)))
                  for name in ("OPT", "CUDA_DEBUGINFO_DEFAULT", "CUDA_DEFAULT_PTX_CC", "FASTMATH",
                               "CUDA_ENABLE_PYNVJITLINK", "CUDA_PER_THREAD_DEFAULT_STREAM"))
    return (numba.__version__, numba_cuda, sys.version_info[:3], capability, flags)


def kernel_key(py_func, targetoptions: dict, argtypes, environment_: tuple) -> str:
    """The cache key of one compiled kernel; raises Unfingerprintable."""
    text = repr((fingerprint(py_func), fingerprint(dict(targetoptions)), tuple(str(t) for t in argtypes),
                 environment_))
    return hashlib.sha256(text.encode()).hexdigest()


class DiskCache:
    """numba-cuda's cache protocol for one dispatcher, backed by the process's KernelStore.
    `key`, when given, is used for every signature (a worker compiling one kernel for its parent)."""

    def __init__(self, dispatcher, key: str | None = None):
        self._dispatcher = dispatcher
        self._fixed_key = key
        self._missed_at = {}

    def key(self, argtypes) -> str | None:
        if self._fixed_key is not None:
            return self._fixed_key
        try:
            return kernel_key(self._dispatcher.py_func, self._dispatcher.targetoptions, argtypes, environment())
        except Unfingerprintable:
            return None

    def load_overload(self, sig, target_context):
        # imported on first use: numba takes seconds to import, and the CPU path never needs it
        from numba.cuda.dispatcher import _Kernel

        key, started = self.key(sig), time.perf_counter()
        payload = store().get(key) if key is not None else None
        if payload is not None:
            try:
                kernel = _Kernel._rebuild(**pickle.loads(payload))
                kernel.bind()  # loads the cubin into this context now, not inside a graph capture
            except Exception as err:  # an entry that does not load is as bad as a corrupt one
                store().drop(key, f"does not load ({type(err).__name__})")
            else:
                STATS.from_cache += 1
                STATS.load_s += time.perf_counter() - started
                return kernel
        self._missed_at[sig] = time.perf_counter()
        return None

    def save_overload(self, sig, kernel):
        STATS.compiled += 1
        STATS.compile_s += time.perf_counter() - self._missed_at.pop(sig, time.perf_counter())
        key = self.key(sig)
        if key is None or getattr(kernel, "launch_config_sensitive", False):
            STATS.not_cached += 1
            return
        try:
            payload = pickle.dumps(kernel._reduce_states(), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # numba refuses to serialise some kernels (linked files): memory only
            STATS.not_cached += 1
            return
        if not store().put(key, payload):
            STATS.not_cached += 1

    def flush(self):
        pass


def _pending(launches: list):
    """The (kernel, numba argument types) not yet compiled in this process, each with its cache key and
    whether the cache holds it."""
    for k, types in launches:
        if types not in k.dispatcher.overloads:
            key = k.dispatcher._cache.key(types)
            yield k, types, key, key is not None and store().contains(key)


def missing(launches: list) -> int:
    """How many of the (kernel, numba argument types) must be compiled (neither in memory nor in the cache)."""
    return sum(not cached for _, _, _, cached in _pending(launches))


def compile_ahead(launches: list, workers: int | None = None) -> int:
    """Make every (kernel, numba argument types) ready: kernels missing from the cache are compiled by up to
    `workers` processes (default: the CPU count) writing the cache, then all are loaded (or, where
    there is no cache or a worker failed, compiled here). Returns the kernels this call compiled or
    loaded."""
    with _compiling:
        return _compile_ahead(launches, workers)


def _compile_ahead(launches: list, workers: int | None) -> int:
    pending = list(_pending(launches))
    absent = [(k, types, key) for k, types, key, cached in pending if key is not None and not cached]
    started, _state["pool"] = _state["pool"], None
    if store().writable and len(absent) >= MIN_PARALLEL:
        pool, count = started or (None, worker_count(min(len(absent), workers or MAX_WORKERS)))
        if count > 1:
            _compile_in_workers(absent, pool or _new_pool(count), count)
    elif started is not None:
        started[0].shutdown(wait=False, cancel_futures=True)
    for k, types in launches:
        # bound to this thread's GPU now: one another thread compiled or loaded (on another GPU) is not yet
        k.dispatcher.compile(types).bind()
    return len(pending)


def worker_count(wanted: int) -> int:
    """Compile workers to use: as wanted, at most one per CPU, MAX_WORKERS, and what free GPU memory allows."""
    # imported on first use: numba takes seconds to import, and a process with every kernel indexed never needs it
    from numba import cuda

    free, _ = cuda.current_context().get_memory_info()
    return max(1, min(wanted, MAX_WORKERS, os.cpu_count() or 1, free // WORKER_GPU_BYTES))


def start_workers_if_cold() -> None:
    """On a machine whose kernel cache is empty (its first run, or after `mlptrain cache clear`), start the
    compile workers now: their start (Python, numba, a CUDA context: ~2 s) then overlaps the loading of
    the data and the building of the model. compile_ahead uses them, or stops them if nothing is missing."""
    if SIMULATOR or _state["pool"] is not None or not store().writable or not store().empty():
        return
    workers = worker_count(MAX_WORKERS)
    if workers > 1:
        _state["pool"] = (_new_pool(workers), workers)


def _new_pool(workers: int):
    # imported on first use: only a process that compiles needs worker processes
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # a forked child cannot use the parent's CUDA
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start, initargs=(str(store().root),))
    # every worker started now, each told to use numba's own names: a compiler needs them, not the driver path's
    saved = os.environ.get(LAUNCH_ENV)
    os.environ[LAUNCH_ENV] = "numba"
    try:
        for _ in range(workers):  # one task each makes the pool start every worker at once
            pool.submit(os.getpid)
    finally:
        if saved is None:
            os.environ.pop(LAUNCH_ENV, None)
        else:
            os.environ[LAUNCH_ENV] = saved
    return pool


def _compile_in_workers(missing, pool, workers: int) -> None:
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from numba.cuda import serialize

    started = time.perf_counter()
    try:
        jobs = [(serialize.dumps((k.dispatcher, types)), key) for k, types, key in missing]
        jobs.sort(key=lambda job: -len(job[0]))  # the biggest (slowest to compile) first: a shorter tail
        with pool:
            results = list(pool.map(_worker_compile, jobs))
    except Exception as err:  # pickling or a worker failed: whatever is missing compiles here instead
        STATS.parallel_error = f"{type(err).__name__}: {err}"
        warn(f"compiling kernels in parallel failed ({STATS.parallel_error}); compiling them one by one")
        if os.environ.get("MLPTRAIN_KERNEL_DEBUG"):
            raise
        return
    STATS.workers = workers
    STATS.compiled_ahead += sum(ok for ok, _, _ in results)
    seconds, name = max((seconds, name) for _, seconds, name in results)
    if seconds > STATS.slowest_s:
        STATS.slowest_s, STATS.slowest = seconds, name
    STATS.ahead_s += time.perf_counter() - started


def _worker_start(root: str) -> None:
    """Each worker: the parent's cache folder, and its CUDA context made before the first kernel arrives."""
    # imported on first use: numba takes seconds to import, and a process with every kernel indexed never needs it
    from numba import config, cuda

    config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    use_store(root)
    cuda.current_context()


def _worker_compile(job) -> tuple[bool, float, str]:
    """Compile one kernel into the cache (a worker process): whether it is there afterwards, the
    seconds it took and its name."""
    blob, key = job
    started = time.perf_counter()
    dispatcher, types = pickle.loads(blob)
    dispatcher._cache = DiskCache(dispatcher, key=key)
    dispatcher.compile(types)
    return store().contains(key), time.perf_counter() - started, dispatcher.py_func.__qualname__
