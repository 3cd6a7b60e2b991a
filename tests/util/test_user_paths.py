"""`~user` paths in settings: Path.expanduser() raises RuntimeError for a user that does not exist, which was a
traceback from `mlptrain cache`, from every run (the data caches' folder) and from data.path."""

from pathlib import Path

import pytest

from mlptrain.backends.kernel_cache.store import default_dir
from mlptrain.data.dataset import default_data_root
from mlptrain.data.decoded_cache import cache_dir
from mlptrain.data.npz import load_npz
from mlptrain.errors import UserError
from mlptrain.util.user_paths import expand_user
from tests.cli.test_cli import assert_clean_failure, mlptrain

NOBODY = "~no-such-user-of-mlptrain/x"


def test_an_unknown_user_in_a_setting_is_one_line_naming_it(monkeypatch):
    assert expand_user("~/x", "X") == Path.home() / "x"
    for env, read in (("MLPTRAIN_KERNEL_CACHE", default_dir), ("MLPTRAIN_DATA_CACHE", cache_dir),
                      ("MLPTRAIN_DATA_DIR", default_data_root)):
        monkeypatch.setenv(env, NOBODY)
        with pytest.raises(UserError, match=f"{env}={NOBODY}: cannot expand ~no-such-user-of-mlptrain"):
            read()
    monkeypatch.delenv("MLPTRAIN_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", NOBODY)
    with pytest.raises(UserError, match="XDG_CACHE_HOME="):
        default_dir()
    with pytest.raises(UserError, match=f"data.path={NOBODY}.npz: cannot expand"):
        load_npz(NOBODY + ".npz")


def test_mlptrain_cache_refuses_it_in_one_line(tmp_path):
    result = mlptrain("cache", cwd=tmp_path, env={"MLPTRAIN_KERNEL_CACHE": "off", "MLPTRAIN_DATA_CACHE": NOBODY})
    assert_clean_failure(result, f"MLPTRAIN_DATA_CACHE={NOBODY}: cannot expand")
