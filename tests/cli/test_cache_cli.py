"""`mlptrain cache` and `mlptrain warmup` as a user meets them (CPU: no kernel is compiled here)."""

from mlptrain.backends.kernel_cache.store import KernelStore
from tests.cli.test_cli import assert_clean_failure, mlptrain


def test_cache_info_shows_the_folder_entries_and_last_run(tmp_path):
    store = KernelStore(tmp_path / "k")
    store.put("ab" * 32, b"x" * 2048)
    store.write_last_run({"run": "r1", "at": "2026-11-23 10:00:00", "compiled": 3, "compile_s": 1.5,
                          "compiled_ahead": 3, "workers": 3, "from_cache": 10, "load_s": 0.01})
    result = mlptrain("cache", cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "k"), "COLUMNS": "200"})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert str(tmp_path / "k") in out and "entries" in out and " 1 " in out and "r1" in out and "3 workers" in out


def test_cache_clear_empties_it(tmp_path):
    store = KernelStore(tmp_path / "k")
    for i in range(3):
        store.put(f"{i:064x}", b"x")
    result = mlptrain("cache", "clear", cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "k")})
    assert result.returncode == 0 and "removed 3 kernels" in result.stdout + result.stderr
    assert store.entries() == []


def test_cache_clear_in_a_folder_of_other_things_removes_only_its_own(tmp_path):
    """MLPTRAIN_KERNEL_CACHE pointed at a home folder: clear removes its entries, its interrupted writes and
    its emptied shards, and nothing of the user's, however alike the names."""
    home = tmp_path / "home"
    store = KernelStore(home)
    key = "ab" * 32
    store.put(key, b"x")
    (home / "ab" / f".{key[:16]}.k2j4.tmp").write_bytes(b"half")  # an interrupted write
    mine = [home / "Music", home / "ab" / "notes.kernel", home / "docs" / ".draft.tmp", home / "docs" / f"{key}.kernel",
            home / "ff" / "photo.jpg", home / ".last-run.json.bak"]
    (home / "Music").mkdir()
    for path in mine[1:]:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"keep")
    result = mlptrain("cache", "clear", cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": str(home)})
    assert result.returncode == 0 and "removed 1 kernel" in result.stdout + result.stderr, result.stderr
    assert all(path.exists() for path in mine)
    assert not store.contains(key) and not (home / "ab" / f".{key[:16]}.k2j4.tmp").exists()


def test_cache_off_says_so(tmp_path):
    result = mlptrain("cache", "info", cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": "off"})
    assert result.returncode == 0 and "off" in result.stdout + result.stderr


def test_warmup_on_the_cpu_compiles_nothing(tmp_path, data_dir):
    result = mlptrain("warmup", "adam_mnist", "backend=cpu", f"data.root={data_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "need no compiling" in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()


def test_warmup_refuses_a_bad_config_in_one_line(tmp_path):
    assert_clean_failure(mlptrain("warmup", "adam_mnist", "optim.lr=-1", cwd=tmp_path), "optim.lr")


def test_a_cache_that_is_a_file_is_refused_not_shown_empty(tmp_path):
    (tmp_path / "k").write_text("a file, not the cache folder")
    for args in (["cache"], ["cache", "info"], ["cache", "clear"]):
        result = mlptrain(*args, cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "k")})
        assert_clean_failure(result, f"kernel cache {tmp_path / 'k'}: not a folder; set MLPTRAIN_KERNEL_CACHE")
    assert (tmp_path / "k").read_text() == "a file, not the cache folder"


def test_cache_shows_and_clears_the_decoded_data_too_and_only_its_own_files(tmp_path, data_dir):
    """Both caches in one command: `clear` empties both, `--data` / `--kernels` one; in a folder of other
    things only the cache's entries and interrupted writes go."""
    from mlptrain.data import decoded_cache

    data = tmp_path / "home"
    data.mkdir()
    mine = [data / "notes.data", data / "mnist-0123.data", data / ".mnist-0123456789abcdef.data.x.tmp",
            data / "photo.jpg"]
    for path in mine:
        path.write_bytes(b"keep")
    env = {"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "k"), "MLPTRAIN_DATA_CACHE": str(data), "COLUMNS": "200",
           "MLPTRAIN_DATA_DIR": str(data_dir)}
    ran = mlptrain("warmup", "adam_mnist", "backend=cpu", cwd=tmp_path, env=env)  # decodes MNIST into the cache
    assert ran.returncode == 0, ran.stderr
    [entry] = decoded_cache.entries(data)
    (data / f".{entry.name}.0badf00d.tmp").write_bytes(b"half")  # an interrupted write
    KernelStore(tmp_path / "k").put("ab" * 32, b"x")

    shown = mlptrain("cache", cwd=tmp_path, env=env)
    out = shown.stdout + shown.stderr
    assert shown.returncode == 0 and "1 (mnist)" in out and "kernel cache" in out, out
    kept = mlptrain("cache", "clear", "--kernels", cwd=tmp_path, env=env)
    out = kept.stdout + kept.stderr
    assert "removed 1 kernels" in out and "decoded" not in out and entry.exists(), out
    cleared = mlptrain("cache", "clear", cwd=tmp_path, env=env)
    out = cleared.stdout + cleared.stderr
    assert cleared.returncode == 0 and f"removed 1 decoded datasets from {data}" in out, out
    assert sorted(data.iterdir()) == sorted(mine) and KernelStore(tmp_path / "k").entries() == []


def test_a_data_cache_that_is_a_file_or_off_is_said_in_one_line(tmp_path):
    (tmp_path / "d").write_text("a file")
    env = {"MLPTRAIN_KERNEL_CACHE": "off", "MLPTRAIN_DATA_CACHE": str(tmp_path / "d")}
    assert_clean_failure(mlptrain("cache", "clear", "--data", cwd=tmp_path, env=env),
                         f"data cache {tmp_path / 'd'}: not a folder; set MLPTRAIN_DATA_CACHE")
    result = mlptrain("cache", cwd=tmp_path, env={**env, "MLPTRAIN_DATA_CACHE": "off", "COLUMNS": "200"})
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "data cache: off" in out and "kernel cache: off" in out, out


def test_a_cache_path_that_can_never_be_a_folder_is_refused_and_clear_removes_nothing(tmp_path):
    """A symlink loop, a path through a file and a name too long read as an empty cache (Path.exists() is
    False for the first two) or a traceback (ENAMETOOLONG); `clear` checked the data folder only after it
    had emptied the kernel cache."""
    store = KernelStore(tmp_path / "k")
    store.put("ab" * 32, b"x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "file").write_text("x")
    bad = {"loop": tmp_path / "loop", "through a file": tmp_path / "file" / "sub", "too long": tmp_path / ("a" * 300)}
    for why, path in bad.items():
        for args in (["cache"], ["cache", "clear"]):
            result = mlptrain(*args, cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "k"),
                                                        "MLPTRAIN_DATA_CACHE": str(path)})
            assert_clean_failure(result, f"data cache {path}: cannot be a folder")
        assert store.entries(), why
    result = mlptrain("cache", "info", cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "loop")})
    assert_clean_failure(result, f"kernel cache {tmp_path / 'loop'}: cannot be a folder")


def test_a_last_run_record_nested_too_deeply_is_not_shown_and_not_a_traceback(tmp_path):
    """json.loads raises RecursionError, not a ValueError, on "[" * 100000: `mlptrain cache` was a traceback."""
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "last-run.json").write_text("[" * 100_000 + "]" * 100_000)
    result = mlptrain("cache", cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "k"),
                                                  "MLPTRAIN_DATA_CACHE": "off", "COLUMNS": "200"})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "last run" not in result.stdout + result.stderr


def test_numbers_in_the_last_run_record_are_shown_only_when_finite(tmp_path):
    """A compile time of 10**400 was an OverflowError at format time and a list record an AttributeError."""
    (tmp_path / "k").mkdir()
    env = {"MLPTRAIN_KERNEL_CACHE": str(tmp_path / "k"), "MLPTRAIN_DATA_CACHE": "off", "COLUMNS": "200"}
    (tmp_path / "k" / "last-run.json").write_text('{"run": "r9", "compile_s": 1%s, "load_s": "soon"}' % ("0" * 400))
    result = mlptrain("cache", cwd=tmp_path, env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    out = result.stdout + result.stderr
    assert "r9" in out and "(0.0 s," in out and "(0.00 s)" in out
    (tmp_path / "k" / "last-run.json").write_text("[1, 2]")
    result = mlptrain("cache", cwd=tmp_path, env=env)
    assert result.returncode == 0 and "last run" not in result.stdout + result.stderr, result.stderr
