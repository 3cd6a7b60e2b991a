"""A sweep on a real PostgreSQL server, started here on 127.0.0.1 with Debian's `initdb` and `pg_ctl` as an
unprivileged user: two workers share one study and each grid point runs once."""

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml

from tests.cli.test_cli import REPO

BIN = Path("/usr/lib/postgresql")


def _bin(name):
    found = shutil.which(name) or next((str(p) for p in sorted(BIN.glob(f"*/bin/{name}"))), None)
    return found


@pytest.fixture
def postgres(tmp_path):
    """postgresql://... of a throw-away server; skipped with the reason where PostgreSQL is not installed
    (and failed in CI, whose .ci/run installs it)."""
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not (initdb and pg_ctl):
        reason = "PostgreSQL's initdb and pg_ctl are not installed (Debian: apt-get install postgresql)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "; .ci/run installs it")
        pytest.skip(reason)
    pytest.importorskip("psycopg", reason="the psycopg driver is not installed (pip install 'mlptrain[postgres]')")
    user = "postgres" if os.getuid() == 0 else None  # initdb refuses to run as root
    data = Path(tempfile.mkdtemp(prefix="mlptrain-pg-"))  # pytest's folders are root's alone
    run_as = ["runuser", "-u", user, "--"] if user else []
    if user:
        entry = pwd.getpwnam(user)
        os.chown(data, entry.pw_uid, entry.pw_gid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([*run_as, initdb, "-D", str(data), "-U", "mlptrain", "--auth=trust"], check=True,
                   capture_output=True, timeout=120)
    subprocess.run([*run_as, pg_ctl, "-D", str(data), "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
                    "-w", "-t", "60", "-l", str(data / "log"), "start"], check=True, capture_output=True, timeout=90)
    try:
        yield f"postgresql://mlptrain@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def test_two_workers_share_a_postgresql_study(tmp_path, postgres, data_dir):
    lrs = [1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3]
    path = tmp_path / "pg.yaml"
    path.write_text(yaml.safe_dump({"base": "adam_mnist", "metric": "val_acc", "parameters": {"optim.lr": lrs}}))
    command = [sys.executable, "-m", "mlptrain", "sweep", str(path), "backend=cpu", "train.epochs=1",
               "model.hidden=[8]", "train.batch_size=5000", "data.val_size=1000", "--runs-dir",
               str(tmp_path / "runs"), "--name", "pg", "--storage", postgres, "--workers", "2"]
    env = {**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "runs" / "pg" / "results.json").read_text())
    assert sorted(t["params"]["optim.lr"] for t in results["trials"]) == lrs
    assert all(t["state"] == "complete" for t in results["trials"])
    study = optuna.load_study(study_name="pg", storage=postgres.replace("postgresql://", "postgresql+psycopg://"))
    assert len(study.get_trials()) == len(lrs)  # each point once: no retries, no duplicates
    workers = {t.system_attrs["mlptrain:worker"]["pid"] for t in study.get_trials()}
    assert len(workers) == 2
