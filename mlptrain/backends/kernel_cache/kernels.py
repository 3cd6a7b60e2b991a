"""The package's kernels as launchable objects: `@kernels.jit` makes a `Kernel`, launched as
`kernel[grid, block, stream](*args)`, and `planning()` records launches instead of running them.

Where numba_names defers numba (a real GPU with `cuda.bindings`), a launch finds the kernel's cubin for its
argument types (cubins.py) and queues it through the driver (backends.driver): a process whose kernels are
all cached never imports numba. A kernel the index lacks is made by numba (its own disk cache, cache.py, or
the compiler), and its cubin then joins the index. Elsewhere (the simulator, MLPTRAIN_CUDA_LAUNCH=numba) the
Kernel is numba's dispatcher with the disk cache, as before.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time

from mlptrain.backends.kernel_cache import cache, cubins, numba_names
from mlptrain.backends.kernel_cache.fingerprint import Unfingerprintable
from mlptrain.backends.kernel_cache.numba_names import DEFERRED, SIMULATOR, Deferred, Name

_planning = threading.local()  # .plan: the Plan this thread records into (a sweep's other trials launch meanwhile)
_building = threading.Lock()  # numba's dispatchers are made (and their code bound) one at a time


class Kernel:
    """A @cuda.jit kernel whose compiled versions come from and go to the disk cache; while `planning()` is
    active a launch only records the kernel and its argument types. `cluster_z`: launched with its (3-D) grid's z
    axis one thread-block cluster (numba_kernels.cluster), which only the driver path can do."""

    __slots__ = ("py_func", "options", "cluster_z", "_dispatcher", "_functions", "_identity")

    def __init__(self, py_func, options: dict, cluster_z: bool = False):
        self.py_func, self.options, self.cluster_z = py_func, dict(options), cluster_z
        self._dispatcher = None
        self._functions = {}  # (GPU, argument type names) -> the loaded CUfunction; False: numba launches it
        self._identity = None

    @property
    def dispatcher(self):
        """numba's dispatcher of this kernel (numba imported, and the kernel's names bound, on first use)."""
        if self._dispatcher is None:
            with _building:
                if self._dispatcher is None:
                    self._dispatcher = _dispatcher(self.py_func, self.options)
        return self._dispatcher

    def __getitem__(self, launch):
        plan = getattr(_planning, "plan", None)
        if plan is not None:
            return functools.partial(plan.record, self)
        if not DEFERRED or len(launch) > 3:
            self._numba_may_launch()
        if not DEFERRED:
            return self.dispatcher[launch]
        if len(launch) > 3:  # dynamic shared memory (none of ours has any): numba launches it
            return self.dispatcher[(*launch[:2], _numba_stream(launch[2]), *launch[3:])]
        grid, block, stream = (tuple(launch) + (0,))[:3]
        return functools.partial(self.launch, grid, block, stream)

    def launch(self, grid, block, stream, *args):
        api, launch = _driver()
        names = argument_types(args)
        function = self._functions.get((api.current_device(), names)) if names is not None else False
        if function is None:
            function = self.load(names, args)
        if function is False:  # numba launches what the driver path cannot
            self._numba_may_launch()
            cache.STATS.numba_launches += 1
            self.dispatcher[grid, block, _numba_stream(stream)](*args)
            return
        launch.launch(function, names, args, grid, block, stream, (1, 1, grid[2]) if self.cluster_z else None)

    def _numba_may_launch(self):
        """Refuses a launch numba would make of a cluster kernel: numba sets no cluster, and the kernel's cluster
        barrier would then wait for blocks that are not in its cluster."""
        if self.cluster_z:
            raise RuntimeError(f"{self.py_func.__name__} runs in thread-block clusters, which only the driver path "
                               "launches (kernel_cache.cluster_launches)")

    def load(self, names: tuple, args):
        """This kernel's function for these argument types, loaded into the current GPU's context: from the
        index, else made by numba and added to it; False when only numba can launch it."""
        api = _driver()[0]
        device = api.current_device()
        capability = api.capability(device)
        key = self.index_key(names, capability)
        function = self._from_index(key) if key is not None else None
        if function is None:
            found = self._from_numba(names, args, capability)
            if found is None:
                function = False
            else:
                if key is not None:
                    cache.store().put(key, cubins.payload(*found))
                function = api.load_function(found[1], found[0])
        self._functions[(device, names)] = function
        return function

    @staticmethod
    def _from_index(key: str):
        """The function the index holds under `key`, loaded; None when it holds none that loads."""
        api = _driver()[0]
        started = time.perf_counter()
        stored = cache.store().get(key)
        found = cubins.entry(stored) if stored is not None else None
        if found is None:
            return None
        try:
            function = api.load_function(found[1], found[0])
        except api.DriverError as err:  # an entry the driver refuses is as bad as a corrupt one
            cache.store().drop(key, f"does not load ({err.code})")
            return None
        cache.STATS.from_index += 1
        cache.STATS.load_s += time.perf_counter() - started
        return function

    def _from_numba(self, names: tuple, args, capability: tuple):
        """(entry name, cubin) of numba's kernel for `args` (numba's cache, or compiled now); None when the
        driver path would pack a type differently from numba, or cannot launch the kernel as numba would."""
        dispatcher = self.dispatcher
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        if tuple(map(str, types)) != names:
            return None
        return cubins.launchable(dispatcher.compile(types), capability)

    def index_key(self, names: tuple, capability: tuple) -> str | None:
        if self._identity is None:
            try:
                self._identity = cubins.identity(self.py_func, self.options)
            except Unfingerprintable:
                self._identity = ""
        return cubins.key(self._identity, names, capability) if self._identity else None

    def ready(self, names: tuple) -> bool:
        """Whether a launch with these argument types needs neither numba nor the disk (loaded already)."""
        api = _driver()[0]
        return (api.current_device(), names) in self._functions


def cluster_launches() -> bool:
    """Whether this thread's GPU takes the package's cluster kernels (`jit(cluster_z=True)`): on the driver path, on
    a GPU of compute capability 9.0 or later (api.cluster_launches)."""
    if not DEFERRED:
        return False
    api = _driver()[0]
    device = api.current_device()
    return device is not None and api.cluster_launches(device)


def early_launches() -> bool:
    """Whether this thread's GPU gets the package's kernels launched early (backends.driver.launch.EARLY, on a GPU
    and driver that allow it: api.dependent_launches); kernels numba launches never are."""
    return DEFERRED and _driver()[1].early()


@functools.cache
def _driver():
    """The driver path's modules, imported once (a launch asks for them each time)."""
    # imported on first use: the driver's bindings load only on a GPU
    from mlptrain.backends.driver import api, launch

    return api, launch


def argument_types(args) -> tuple | None:
    """The numba type names of a launch's arguments; None when the driver path cannot pass one of them."""
    launch = _driver()[1]
    try:
        return tuple(map(launch.typename, args))
    except launch.Unlaunchable:
        return None


def _numba_stream(stream):
    """numba's stream object for a driver stream (0 stays the legacy default stream)."""
    # imported on first use: only a launch the driver path cannot make needs numba's streams
    from numba import cuda

    return stream if isinstance(stream, int) else cuda.external_stream(int(stream))


def _dispatcher(py_func, options: dict):
    # imported on first use: numba takes 0.6 s to import, and a warm process never needs it
    import numba
    from numba import cuda

    if DEFERRED:
        numba_names.bind(py_func)
        numba.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0  # small MLP grids are launch-bound by design
    dispatcher = cuda.jit(**options)(py_func)
    if not SIMULATOR:
        dispatcher._cache = cache.DiskCache(dispatcher)
    return dispatcher


def jit(fn=None, cluster_z=False, **options):
    """`@kernels.jit` / `@kernels.jit(**cuda_jit_options)`: cuda.jit, with the disk cache on a real GPU;
    `cluster_z`: see Kernel."""
    def build(f):
        kernel = Kernel(f, options, cluster_z)
        if not DEFERRED:  # made now, as numba's own decorator would
            kernel._dispatcher = _dispatcher(f, options)
        return kernel

    return build(fn) if fn is not None else build


def launch_bounds(threads, blocks):
    """`jit` options capping a kernel's registers so that `blocks` blocks of `threads` fit an SM; the simulator
    takes no such option."""
    return {} if SIMULATOR else {"launch_bounds": (threads, blocks)}


def device(fn):
    """`@kernels.device`: a device function that NVVM inlines into every kernel calling it (the
    `alwaysinline` attribute, numba-cuda's forceinline). numba's own IR-level inlining (`inline="always"`)
    gives the same machine code but copies the callee's IR at each call site: on an H100 host it was
    9.0 of the 13.8 s a tiled GEMM kernel took to compile. The simulator takes neither option."""
    if DEFERRED:
        return Deferred(Deferred(Name("cuda.jit"), (), {"device": True, "forceinline": True}), (fn,))
    # imported here: numba is already imported on this path (numba_names)
    from numba import cuda

    if SIMULATOR:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


class Plan:
    """The distinct (kernel, argument types) that the launches made while planning would need, each with the
    arguments of one such launch (numba types them when it must compile)."""

    def __init__(self):
        self.launches: dict = {}

    def record(self, kernel_: Kernel, *args):
        if SIMULATOR:  # the simulator compiles nothing; record what ran, for tests
            argtypes = tuple(type(a).__name__ for a in args)
        elif DEFERRED:
            argtypes = argument_types(args)
        else:
            argtypes = tuple(kernel_.dispatcher.typeof_pyval(a) for a in args)
        self.launches.setdefault((id(kernel_), argtypes), (kernel_, argtypes, args))

    def __len__(self):
        return len(self.launches)

    def numba_launches(self, launches=None) -> list:
        """(kernel, numba argument types) of `launches` (default: all), numba imported to type them."""
        return [(k, tuple(k.dispatcher.typeof_pyval(a) for a in args))
                for k, _, args in (self.launches.values() if launches is None else launches)]


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


def _unindexed(plan: Plan) -> list:
    """The planned launches the driver path cannot serve from memory or the index (numba must make them)."""
    api = _driver()[0]
    capability = api.capability(api.current_device())
    out = []
    for launch in plan.launches.values():
        k, names, _ = launch
        if names is None or not (k.ready(names) or _indexed(k, names, capability)):
            out.append(launch)
    return out


def _indexed(k: Kernel, names: tuple, capability: tuple) -> bool:
    key = k.index_key(names, capability)
    return key is not None and cache.store().contains(key)


def missing(plan: Plan) -> int:
    """How many of the planned kernels must be compiled (in neither memory, the index nor numba's cache)."""
    if SIMULATOR:
        return 0
    if DEFERRED:
        unindexed = _unindexed(plan)
        return cache.missing(plan.numba_launches(unindexed)) if unindexed else 0
    return cache.missing(plan.numba_launches())


def compile_ahead(plan: Plan, workers: int | None = None) -> int:
    """Make every launch of `plan` ready (see cache.compile_ahead); on the driver path, load each kernel's
    function too, so that no step and no graph capture waits for the disk or numba. Returns the kernels
    this call compiled or loaded."""
    if SIMULATOR:
        return 0
    if not DEFERRED:
        return cache.compile_ahead(plan.numba_launches(), workers)
    unindexed = _unindexed(plan)
    if unindexed:
        cache.compile_ahead(plan.numba_launches(unindexed), workers)
    pending = [(k, names, args) for k, names, args in plan.launches.values() if names is not None and not k.ready(names)]
    for k, names, args in pending:
        k.load(names, args)
    return len(pending)
