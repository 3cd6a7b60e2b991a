"""Compiled kernels cached on disk, and what a run needs compiled up front, in parallel.

Every kernel of the package is declared with `@kernel_cache.jit` (with cuda.jit's options) instead
of `@cuda.jit`. On a GPU its dispatcher gets a `DiskCache`: when numba-cuda needs a version of the
kernel for new argument types it asks the cache first (numba-cuda's own per-dispatcher cache
protocol, `load_overload` / `save_overload`), and stores what it compiled (PTX and cubin). An
entry's key digests everything that decides the machine code: the kernel's fingerprint (bytecode,
captured specialisation values, every device function it reaches; see fingerprint.py), the
argument types, the jit options, numba's and numba-cuda's versions, Python's, the GPU's compute
capability and the codegen settings. Different configs that share shapes and dtypes share kernels.

A first run is fast too: `planning()` records the launches a training window and an evaluation
would make without running them, and `compile_ahead` compiles the missing ones in worker processes
(numba holds one compiler lock per process) that write the cache, then loads them all. `STATS`
counts what this process compiled and loaded, for summary.json.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import os
import pickle
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from importlib.metadata import version

from numba import config, cuda

from mlptrain.backends.kernel_cache.fingerprint import Unfingerprintable, fingerprint
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
_planning = threading.local()  # .plan: the Plan this thread records into (a sweep's other trials launch meanwhile)
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
    return _environment(tuple(cuda.get_current_device().compute_capability))


@functools.cache
def _environment(capability: tuple) -> tuple:
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    import numba

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


class Kernel:
    """A @cuda.jit kernel launched as `kernel[grid, block, stream](*args)`, whose compiled versions
    come from and go to the disk cache; while `planning()` is active a launch only records the kernel
    and its argument types."""

    __slots__ = ("dispatcher",)

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def __getitem__(self, launch):
        plan = getattr(_planning, "plan", None)
        if plan is not None:
            return functools.partial(plan.record, self)
        return self.dispatcher[launch]

    def __getattr__(self, name):
        return getattr(self.dispatcher, name)


def jit(fn=None, **options):
    """`@kernel_cache.jit` / `@kernel_cache.jit(**cuda_jit_options)`: cuda.jit, with the disk cache on a real GPU."""
    def build(f):
        dispatcher = cuda.jit(**options)(f)
        if not config.ENABLE_CUDASIM:
            dispatcher._cache = DiskCache(dispatcher)
        return Kernel(dispatcher)

    return build(fn) if fn is not None else build


def device(fn):
    """`@kernel_cache.device`: a device function that NVVM inlines into every kernel calling it (the
    `alwaysinline` attribute, numba-cuda's forceinline). numba's own IR-level inlining (`inline="always"`)
    gives the same machine code but copies the callee's IR at each call site: on an H100 host it was
    9.0 of the 13.8 s a tiled GEMM kernel took to compile. The simulator takes neither option."""
    if config.ENABLE_CUDASIM:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


class Plan:
    """The distinct (kernel, argument types) that the launches made while planning would need."""

    def __init__(self):
        self.launches: dict = {}

    def record(self, kernel_: Kernel, *args):
        if config.ENABLE_CUDASIM:  # the simulator compiles nothing; record what ran, for tests
            argtypes = tuple(type(a).__name__ for a in args)
        else:
            argtypes = tuple(kernel_.dispatcher.typeof_pyval(a) for a in args)
        self.launches.setdefault((id(kernel_), argtypes), (kernel_, argtypes))

    def __len__(self):
        return len(self.launches)


@contextlib.contextmanager
def planning():
    """Within the block, this thread's kernel launches are recorded in the yielded Plan, not run."""
    if getattr(_planning, "plan", None) is not None:
        raise RuntimeError("planning() does not nest")
    plan = _planning.plan = Plan()
    try:
        yield plan
    finally:
        _planning.plan = None


def _pending(plan: Plan):
    """The planned (kernel, argument types) not yet compiled in this process, each with its cache key
    and whether the cache holds it."""
    for k, types in plan.launches.values():
        if types not in k.dispatcher.overloads:
            key = k.dispatcher._cache.key(types)
            yield k, types, key, key is not None and store().contains(key)


def missing(plan: Plan) -> int:
    """How many of the planned kernels must be compiled (neither in memory nor in the cache)."""
    if config.ENABLE_CUDASIM:
        return 0
    return sum(not cached for _, _, _, cached in _pending(plan))


def compile_ahead(plan: Plan, workers: int | None = None) -> int:
    """Make every launch of `plan` ready: kernels missing from the cache are compiled by up to
    `workers` processes (default: the CPU count) writing the cache, then all are loaded (or, where
    there is no cache or a worker failed, compiled here). Returns the kernels this call compiled or
    loaded."""
    if config.ENABLE_CUDASIM:
        return 0
    with _compiling:
        return _compile_ahead(plan, workers)


def _compile_ahead(plan: Plan, workers: int | None) -> int:
    pending = list(_pending(plan))
    absent = [(k, types, key) for k, types, key, cached in pending if key is not None and not cached]
    started, _state["pool"] = _state["pool"], None
    if store().writable and len(absent) >= MIN_PARALLEL:
        pool, count = started or (None, worker_count(min(len(absent), workers or MAX_WORKERS)))
        if count > 1:
            _compile_in_workers(absent, pool or _new_pool(count), count)
    elif started is not None:
        started[0].shutdown(wait=False, cancel_futures=True)
    for k, types in plan.launches.values():
        # bound to this thread's GPU now: one another thread compiled or loaded (on another GPU) is not yet
        k.dispatcher.compile(types).bind()
    return len(pending)


def worker_count(wanted: int) -> int:
    """Compile workers to use: as wanted, at most one per CPU, MAX_WORKERS, and what free GPU memory allows."""
    free, _ = cuda.current_context().get_memory_info()
    return max(1, min(wanted, MAX_WORKERS, os.cpu_count() or 1, free // WORKER_GPU_BYTES))


def start_workers_if_cold() -> None:
    """On a machine whose kernel cache is empty (its first run, or after `mlptrain cache clear`), start the
    compile workers now: their start (Python, numba, a CUDA context: ~2 s) then overlaps the loading of
    the data and the building of the model. compile_ahead uses them, or stops them if nothing is missing."""
    if config.ENABLE_CUDASIM or _state["pool"] is not None or not store().writable or not store().empty():
        return
    workers = worker_count(MAX_WORKERS)
    if workers > 1:
        pool = _new_pool(workers)
        for _ in range(workers):  # one task each makes the pool start every worker at once
            pool.submit(os.getpid)
        _state["pool"] = (pool, workers)


def _new_pool(workers: int) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")  # a forked child cannot use the parent's CUDA
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start, initargs=(str(store().root),))


def _compile_in_workers(missing, pool: ProcessPoolExecutor, workers: int) -> None:
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
