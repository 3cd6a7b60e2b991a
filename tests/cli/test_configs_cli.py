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


def test_configs_copy_writes_a_builtin_to_edit_and_run(tmp_path):
    result = mlptrain("configs", "copy", "adam_mnist", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    copied = tmp_path / "adam_mnist.yaml"
    assert copied.read_text() == mlptrain("configs", "show", "adam_mnist", cwd=tmp_path).stdout
    assert "mlptrain run adam_mnist.yaml" in " ".join(result.stderr.split())
    printed = mlptrain("run", str(copied), "--print-config", cwd=tmp_path)
    assert printed.returncode == 0 and yaml.safe_load(printed.stdout)["optim"]["name"] == "adam"
    # a folder as the destination takes NAME.yaml; a sweep copies too
    (tmp_path / "mine").mkdir()
    assert mlptrain("configs", "copy", "sweep_lr_mnist", "mine", cwd=tmp_path).returncode == 0
    assert yaml.safe_load((tmp_path / "mine" / "sweep_lr_mnist.yaml").read_text())["method"] == "grid"


def test_configs_copy_never_replaces_a_file_without_force(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("my own edits\n")
    assert_clean_failure(mlptrain("configs", "copy", "sgd_mnist", str(mine), cwd=tmp_path),
                         f"{mine} exists; use --force to replace it")
    assert mine.read_text() == "my own edits\n"
    assert mlptrain("configs", "copy", "sgd_mnist", str(mine), "--force", cwd=tmp_path).returncode == 0
    assert mine.read_text().startswith("description:")
    assert_clean_failure(mlptrain("configs", "copy", "adam_mnistt", cwd=tmp_path), "did you mean 'adam_mnist'?")
    assert_clean_failure(mlptrain("configs", "copy", "adam_mnist", str(tmp_path / "no" / "such" / "x.yaml"),
                                  cwd=tmp_path), "cannot write it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


def test_configs_list_is_bare_configs(tmp_path):
    listed, bare = mlptrain("configs", "list", cwd=tmp_path), mlptrain("configs", cwd=tmp_path)
    assert listed.returncode == 0 and (listed.stdout, listed.stderr) == (bare.stdout, bare.stderr)
    assert "sweep_lr_mnist" in listed.stderr and "adam_mnist" in listed.stderr
