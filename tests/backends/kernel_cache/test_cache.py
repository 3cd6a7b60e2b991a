"""The on-disk kernel cache: keys that change with whatever changes the machine code, entries that
survive corruption, races and read-only folders, and (on a real GPU) kernels loaded from disk that
compute bitwise what freshly compiled ones do."""

import multiprocessing
import os
import stat

import numpy as np
import pytest
from numba import cuda, float32, int32

from mlptrain.backends.kernel_cache import cache as kernel_cache
from mlptrain.backends.kernel_cache import kernels
from mlptrain.backends.kernel_cache.fingerprint import Unfingerprintable, fingerprint
from mlptrain.backends.kernel_cache.store import MAGIC, KernelStore

ON_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def make_kernel(tile, dtype=float32, scale=2):
    """A factory like the package's: the closure's values are the specialisation."""
    @cuda.jit(device=True, inline="always")
    def load(value):
        return dtype(value) * scale

    def body(out, x):
        for i in range(cuda.grid(1), x.shape[0], tile):
            out[i] = load(x[i])

    return body


def test_fingerprint_is_stable_and_sees_every_specialisation():
    base = fingerprint(make_kernel(64))
    assert fingerprint(make_kernel(64)) == base  # a new closure of the same values: the same kernel
    assert fingerprint(make_kernel(128)) != base  # a captured constant
    assert fingerprint(make_kernel(64, int32)) != base  # a captured numba type, inside a device function
    assert fingerprint(make_kernel(64, scale=3)) != base  # a value two closures deep


def test_fingerprint_sees_the_code_and_the_globals_it_names():
    namespace = {"cuda": cuda, "STEP": 1}
    exec("def body(out):\n    out[0] = STEP\n", namespace)
    first = fingerprint(namespace["body"])
    namespace["STEP"] = 2
    assert fingerprint(namespace["body"]) != first
    exec("def body(out):\n    out[0] = STEP + 1\n", namespace)
    assert len({first, fingerprint(namespace["body"])}) == 2


def test_an_undescribable_capture_is_not_cached():
    class Opaque:
        pass

    thing = Opaque()

    def body(out):
        out[0] = thing

    with pytest.raises(Unfingerprintable, match="Opaque"):
        fingerprint(body)


def test_the_key_covers_argument_types_options_and_environment():
    fn = make_kernel(64)
    args = ("array(float32, 1d, C)", "array(float32, 1d, C)")
    env = ("0.68.1", "0.30.4", (3, 12, 0), (9, 0), ())
    key = kernel_cache.kernel_key(fn, {}, args, env)
    assert kernel_cache.kernel_key(fn, {}, args, env) == key
    variants = [
        kernel_cache.kernel_key(fn, {}, ("array(float16, 1d, C)", args[1]), env),
        kernel_cache.kernel_key(fn, {"launch_bounds": (256,)}, args, env),
        kernel_cache.kernel_key(fn, {}, args, ("0.69.0", *env[1:])),
        kernel_cache.kernel_key(fn, {}, args, (*env[:3], (8, 0), ())),
        kernel_cache.kernel_key(make_kernel(32), {}, args, env),
    ]
    assert len({key, *variants}) == 6


def test_a_corrupt_or_truncated_entry_is_dropped_and_reported(tmp_path, capsys):
    store = KernelStore(tmp_path)
    key = "ab" * 32
    assert store.put(key, b"payload") and store.get(key) == b"payload"
    path = store.path(key)
    data = path.read_bytes()
    for bad in (data[:-1], data[:-1] + b"X", b"garbage", b""):
        path.write_bytes(bad)
        assert store.get(key) is None and not path.exists()
        assert "corrupt or truncated; rebuilding it" in capsys.readouterr().err
        store.put(key, b"payload")
    assert store.get(key) == b"payload" and data.startswith(MAGIC)


def test_a_read_only_cache_degrades_to_memory_with_one_warning(tmp_path, capsys):
    if os.geteuid() == 0:
        folder = tmp_path / "file-not-folder"
        folder.write_text("")  # root can write anywhere; a file where the folder should be fails for all
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    store = KernelStore(folder)
    assert not store.put("cd" * 32, b"x") and not store.put("ef" * 32, b"y")
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and "compiling kernels in memory" in err
    assert store.get("cd" * 32) is None


def _fill(root, worker, keys):
    store = KernelStore(str(root))  # a worker process is handed the folder as text
    for key in keys:
        store.put(key, (f"{key}:" * 2000).encode())


def test_processes_filling_the_cache_at_once_leave_it_valid(tmp_path):
    keys = [f"{i:064x}" for i in range(40)]
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_fill, args=(tmp_path, w, keys)) for w in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    store = KernelStore(tmp_path)
    assert all(store.get(key) == (f"{key}:" * 2000).encode() for key in keys)
    assert not list(tmp_path.glob("*/.*.tmp"))  # no temporary file left behind


def test_clear_removes_entries_and_strays(tmp_path):
    store = KernelStore(tmp_path)
    for i in range(3):
        store.put(f"{i:064x}", b"x")
    (store.path(f"{0:064x}").parent / f".{0:016x}.a1b2c3.tmp").write_bytes(b"half")  # as `put` names one
    assert store.clear() == 3 and store.entries() == [] and not any(tmp_path.iterdir())


def test_the_cache_folder_comes_from_the_environment(monkeypatch, tmp_path):
    from mlptrain.backends.kernel_cache.store import default_dir

    monkeypatch.setenv("MLPTRAIN_KERNEL_CACHE", str(tmp_path / "k"))
    assert default_dir() == tmp_path / "k"
    monkeypatch.setenv("MLPTRAIN_KERNEL_CACHE", "off")
    assert default_dir() is None and KernelStore(None).put("a" * 64, b"x") is False
    monkeypatch.delenv("MLPTRAIN_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "mlptrain" / "kernels"


def test_planning_records_launches_without_running_them(rng):
    @kernels.jit
    def double(out, x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] * 2

    x = cuda.to_device(np.ones(8, np.float32))
    out = cuda.to_device(np.zeros(8, np.float32))
    with kernels.planning() as plan:
        double[1, 8](out, x)
        double[1, 8](out, x)
    assert len(plan) == 1 and out.copy_to_host().sum() == 0  # recorded once, not run
    double[1, 8](out, x)
    assert out.copy_to_host().sum() == 16


@pytest.mark.real_gpu
def test_a_kernel_from_the_cache_computes_what_a_fresh_one_does(tmp_path, rng):
    """Compile into an empty cache, then load the same kernel into a fresh dispatcher: same bits."""
    kernel_cache.use_store(tmp_path)
    try:
        body = make_kernel(64, scale=3)
        x = cuda.to_device(rng.standard_normal(1000).astype(np.float32))
        results = []
        for _ in range(2):
            fresh = kernels.jit(body)  # a new dispatcher: nothing compiled in memory
            before = kernel_cache.STATS.from_cache
            out = cuda.to_device(np.full(1000, np.nan, np.float32))
            fresh[4, 64](out, x)
            results.append((out.copy_to_host(), kernel_cache.STATS.from_cache - before))
        (first, loaded_first), (second, loaded_second) = results
        assert loaded_first == 0 and loaded_second == 1
        assert np.array_equal(first.view(np.uint32), second.view(np.uint32))
        assert len(KernelStore(tmp_path).entries()) == 1
    finally:
        kernel_cache.use_store(None)
