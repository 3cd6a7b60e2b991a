"""`mlptrain configs show NAME [KEY=VALUE ...]` and `mlptrain run ... --print-config`: the resolved config,
printed without touching the runs directory; mistyped built-in names get the closest one."""

import yaml

from tests.cli.test_cli import assert_clean_failure, mlptrain


def test_print_config_resolves_and_writes_nothing(tmp_path):
    result = mlptrain("run", "autoencoder_cifar10", "train.epochs=2", "train.early_stopping.patience=3",
                      "--print-config", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path,
                      env={"MLPTRAIN_DATA_DIR": str(tmp_path / "data")})
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["train"]["epochs"] == 2 and printed["train"]["early_stopping"]["patience"] == 3
    assert printed["train"]["loss_scale"]["growth_interval"] == 2000  # every default filled in
    assert printed["data"]["root"] == str(tmp_path / "data")  # the folder a run would read
    assert set(printed["model"]) == {"type", "channels", "kernel_size", "init"}  # no MLP keys
    assert not (tmp_path / "runs").exists()
    shown = mlptrain("configs", "show", "autoencoder_cifar10", "train.epochs=2", "train.early_stopping.patience=3",
                     cwd=tmp_path, env={"MLPTRAIN_DATA_DIR": str(tmp_path / "data")})
    assert yaml.safe_load(shown.stdout) == printed


def test_configs_show_without_overrides_prints_the_file_itself(tmp_path):
    shown = mlptrain("configs", "show", "adam_mnist", cwd=tmp_path)
    assert shown.stdout.startswith("description:") and "loss_scale" not in shown.stdout


def test_mistyped_names_get_the_closest_builtin(tmp_path):
    assert_clean_failure(mlptrain("run", "adam_mnsit", cwd=tmp_path), "did you mean 'adam_mnist'?")
    assert_clean_failure(mlptrain("configs", "show", "sweep_lr_mnst", cwd=tmp_path), "did you mean 'sweep_lr_mnist'?")
    assert_clean_failure(mlptrain("sweep", "sweep_lr_mnst", cwd=tmp_path), "did you mean 'sweep_lr_mnist'?")
    assert_clean_failure(mlptrain("run", "sweep_lr_mnist", cwd=tmp_path), "run it with `mlptrain sweep sweep_lr_mnist`")
    assert_clean_failure(mlptrain("run", "adam_mnist", "optim.learning_rate=0.1", cwd=tmp_path),
                         "unknown key 'optim.learning_rate'; did you mean 'optim.lr'?")
    assert_clean_failure(mlptrain("run", "adam_mnist", "optim.lr=fast", cwd=tmp_path),
                         "override optim.lr=fast: expected float, got 'fast'")
