"""numba's names deferred: the kernel modules import without numba where the driver path runs them, and a
kernel's code gets numba's real objects before numba compiles it."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mlptrain.backends.kernel_cache import cubins, numba_names
from mlptrain.backends.kernel_cache.numba_names import Deferred, Name


def deferred(script: str) -> str:
    """Run `script` in a process where the kernel modules defer numba (no simulator); its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", numba_names.LAUNCH_ENV)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_kernel_modules_import_without_numba():
    out = deferred("""
        import sys
        import mlptrain.backends.numba_kernels
        from mlptrain.backends.kernel_cache import kernels, numba_names
        from mlptrain.backends.numba_kernels import optim
        import numpy as np
        optim._make_updates(np.dtype(np.float16))  # a factory runs too
        print(numba_names.DEFERRED, "numba" in sys.modules)
    """)
    assert out.split() == ["True", "False"]


def test_binding_gives_a_kernel_numbas_objects_and_keeps_its_identity():
    out = deferred("""
        import sys
        import numpy as np
        from mlptrain.backends.kernel_cache import cubins, numba_names
        from mlptrain.backends.numba_kernels import optim
        kernels = optim._make_updates(np.dtype(np.uint16))
        adam = kernels[2]
        before = cubins.identity(adam.py_func, adam.options)
        numba_names.bind(adam.py_func)
        after = cubins.identity(adam.py_func, adam.options)
        span = adam.py_func.__closure__[[c for c in adam.py_func.__code__.co_freevars].index("adam_span")].cell_contents
        print(before == after, type(span).__name__, "numba" in sys.modules)
    """)
    assert out.split() == ["True", "CUDADispatcher", "True"]


def test_names_cast_like_numba_and_refuse_everything_else():
    assert Name("float32")(1.5) == np.float32(1.5) and type(Name("float32")(1.5)) is np.float32
    assert type(Name("uint64")(3)) is np.uint64
    assert isinstance(Name("cuda.jit")(device=True), Deferred)
    with pytest.raises(RuntimeError, match="before numba was imported"):
        Name("cuda").get_current_device()
    with pytest.raises(TypeError, match="truth value"):
        bool(Name("config").ENABLE_CUDASIM)


def test_kernels_of_one_factory_get_different_identities():
    def factory(width, dtype):
        def kernel(out):
            out[0] = width * dtype(1)
        return kernel

    a, b, c = factory(4, np.float32), factory(8, np.float32), factory(4, np.float16)
    ids = {cubins.identity(k, {}) for k in (a, b, c)}
    assert len(ids) == 3 and cubins.identity(factory(4, np.float32), {}) == cubins.identity(a, {})
    assert cubins.identity(a, {"launch_bounds": (256,)}) != cubins.identity(a, {})
    capability = (9, 0)
    key = cubins.key(cubins.identity(a, {}), ("array(float32, 1d, C)",), capability)
    assert key != cubins.key(cubins.identity(a, {}), ("array(float64, 1d, C)",), capability)
    assert key != cubins.key(cubins.identity(a, {}), ("array(float32, 1d, C)",), (8, 0))


def test_one_name_defined_in_two_branches_gets_two_identities():
    """A factory defining one name in two branches with one closure (tiles.dense_operand's `fetch`, array[i, k]
    or array[k, i]): two kernels, two cubins."""
    def factory(flag, scale):
        if flag:
            def fetch(out):
                out[0] = scale
        else:
            def fetch(out):
                out[1] = scale
        return fetch

    assert cubins.identity(factory(True, 2.0), {}) != cubins.identity(factory(False, 2.0), {})
    assert cubins.identity(factory(True, 2.0), {}) == cubins.identity(factory(True, 2.0), {})


def test_an_object_it_cannot_name_is_never_keyed():
    marker = object()

    def kernel(out):
        out[0] = marker is None

    with pytest.raises(cubins.Unfingerprintable):
        cubins.identity(kernel, {})


def test_index_entries_round_trip_and_refuse_garbage():
    assert cubins.entry(cubins.payload("_Z6kernel", b"\x7fELF...")) == ("_Z6kernel", b"\x7fELF...")
    assert cubins.entry(b"no newline") is None and cubins.entry(b"name\n") is None
