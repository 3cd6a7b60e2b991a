"""Configs that extend another (`base:`), and descriptions that say when they no longer describe what ran."""

import subprocess
import sys

import pytest
import yaml

from mlptrain.config.load import load_config, read_config
from mlptrain.errors import UserError
from mlptrain.sweep.spec import load_sweep
from tests.cli.test_cli import REPO

BASE_DESCRIPTION = "MLP 784-512-512-10 on MNIST with Adam (lr 1e-3 cosine-annealed to 0, batch 128, 10 epochs)"


def write(path, document):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_a_config_extends_a_builtin_section_by_section(tmp_path):
    path = write(tmp_path / "fast.yaml", {"base": "adam_mnist", "optim": {"lr": 0.01}, "train": {"epochs": 2}})
    config = load_config(path)
    assert config.optim.lr == 0.01 and config.optim.name == "adam" and config.optim.betas == (0.9, 0.999)
    assert config.train.epochs == 2 and config.train.batch_size == 128 and config.model.hidden == (512, 512)
    assert config.description == f"{BASE_DESCRIPTION} [overridden: optim.lr, train.epochs]"


def test_a_chain_resolves_each_base_beside_the_file_that_names_it(tmp_path):
    write(tmp_path / "shared" / "wide.yaml", {"base": "adam_mnist", "description": "wide", "model": {"hidden": [1024]}})
    path = write(tmp_path / "runs" / "mine.yaml", {"base": "../shared/wide.yaml", "seed": 3})
    config = load_config(path)
    assert config.model.hidden == (1024,) and config.seed == 3 and config.optim.name == "adam"
    assert config.description == "wide"  # its own description: nothing changed since it was written
    assert "base" not in read_config(path)[0]


@pytest.mark.parametrize("links", [["a.yaml"], ["b.yaml", "a.yaml"]])
def test_a_loop_is_refused_naming_the_chain(tmp_path, links):
    names = ["a.yaml", *links]
    for name, base in zip(names, links):
        write(tmp_path / name, {"base": base, "seed": 1})
    with pytest.raises(UserError, match=r"base: the chain loops: .*a\.yaml -> .*a\.yaml"):
        load_config(tmp_path / "a.yaml")


def test_a_chain_longer_than_the_limit_is_refused(tmp_path):
    for i in range(20):
        write(tmp_path / f"c{i}.yaml", {"base": f"c{i + 1}.yaml"})
    with pytest.raises(UserError, match="a chain of more than 16 configs"):
        load_config(tmp_path / "c0.yaml")


@pytest.mark.parametrize("base, fragment", [
    (["adam_mnist"], "base: expected a config file or a built-in config name, got"),
    ("", "base: expected a config file"),
    ("adam_mnst", "base: 'adam_mnst' is neither a file beside it nor a built-in config (built-in: "),
    ("missing.yaml", "base: 'missing.yaml' is neither"),
])
def test_a_bad_base_is_one_line(tmp_path, base, fragment):
    path = write(tmp_path / "bad.yaml", {"base": base})
    with pytest.raises(UserError, match="bad.yaml: " + fragment.replace("(", r"\(").replace("[", r"\[")):
        load_config(path)


def test_a_base_that_is_not_a_mapping_is_refused(tmp_path):
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    path = write(tmp_path / "top.yaml", {"base": "list.yaml"})
    with pytest.raises(UserError, match="list.yaml: a config must be a mapping of sections"):
        load_config(path)


@pytest.mark.parametrize("overrides, description", [
    (["optim.lr=0.01", "model.hidden=[64]"], f"{BASE_DESCRIPTION} [overridden: model.hidden, optim.lr]"),
    (["train.log_every=10", "seed=4", "backend=cpu"], BASE_DESCRIPTION),
    (["train.batch_size=64"], f"{BASE_DESCRIPTION} [overridden: train.batch_size]"),
    (["optim.lr=0.01", "description=lr 1e-2"], "lr 1e-2"),
])
def test_overrides_of_what_the_description_describes_mark_it(overrides, description):
    assert load_config(REPO / "configs" / "adam_mnist.yaml", overrides).description == description


def test_a_marked_description_is_marked_once_naming_every_key(tmp_path):
    path = write(tmp_path / "run.yaml", {"base": "adam_mnist", "optim": {"lr": 0.01}})
    once = load_config(path, ["data.val_size=1000"]).description
    assert once == f"{BASE_DESCRIPTION} [overridden: data.val_size, optim.lr]"
    again = write(tmp_path / "again.yaml", {**yaml.safe_load(path.read_text()), "description": once})
    assert load_config(again, ["optim.lr=0.1"]).description == once


def test_a_sweep_trial_marks_the_description_with_its_parameters(tmp_path):
    path = write(tmp_path / "sweep.yaml", {"base": "adam_mnist", "metric": "val_acc",
                                           "parameters": {"optim.lr": [0.01], "seed": [0, 1]}})
    spec = load_sweep(path, ["model.hidden=[32]"])
    config = spec.trial_config({"optim.lr": 0.01, "seed": 1}, "trial")
    assert config.description == f"{BASE_DESCRIPTION} [overridden: model.hidden, optim.lr]"
    assert "[overridden" not in spec.raw["description"]  # the sweep's own record (what a re-run compares) is as written


def test_print_config_shows_the_merged_config(tmp_path):
    path = write(tmp_path / "fast.yaml", {"base": "adam_mnist", "optim": {"lr": 0.01}})
    shown = subprocess.run([sys.executable, "-m", "mlptrain", "run", str(path), "--print-config"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    printed = yaml.safe_load(shown.stdout)
    assert "base" not in printed and printed["optim"]["lr"] == 0.01 and printed["optim"]["name"] == "adam"
    assert printed["description"].endswith("[overridden: optim.lr]")
