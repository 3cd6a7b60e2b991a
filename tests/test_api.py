"""mlptrain.api: train from a name, a file or a dict, then load the run and predict on arrays, as the CLI
does (the same code underneath); errors are the CLI's one-line UserErrors."""

import json

import numpy as np
import pytest

from mlptrain.api import load, train
from mlptrain.errors import UserError
from mlptrain.inference.model import load_trained, softmax
from mlptrain.run_dirs.lock import lock_run, release_run
from tests.conftest import DATA_DIR, real_data_missing

TINY = ["backend=cpu", "train.epochs=1", "model.hidden=[16]", "train.batch_size=256"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not (DATA_DIR / "mnist").is_dir():
        real_data_missing("real datasets")
    return train("adam_mnist", [*TINY, f"data.root={DATA_DIR}"], runs_dir=tmp_path_factory.mktemp("api"), name="a")


def test_train_returns_the_summary_and_the_folder(run):
    assert run.run_dir.name == "a" and (run.run_dir / "checkpoints" / "best.npz").is_file()
    assert run.summary == json.loads((run.run_dir / "summary.json").read_text()) and run.summary["test_acc"] > 0.8
    lock_run(run.run_dir, "a test")  # train let its run go: another command (or process) may take it
    release_run(run.run_dir)


def test_a_dict_config_extends_a_builtin(tmp_path, data_dir):
    config = {"base": "adam_mnist", "train": {"epochs": 1, "batch_size": 256}, "model": {"hidden": [8]},
              "backend": "cpu", "data": {"root": str(data_dir), "val_size": 0.05}}
    done = train(config, ["optim.lr=0.003"], runs_dir=tmp_path)
    assert done.run_dir.parent == tmp_path and done.run_dir.name.startswith("config-")
    assert done.summary["dataset"]["val"] == 3000  # 5% of MNIST's 60,000 training images


def test_load_predicts_what_the_cli_predicts_on_any_layout(run):
    model = load(run.run_dir)
    trained = load_trained(run.run_dir)
    images = trained.dataset.test_images[:7]
    expected = softmax(trained.images(images))
    for layout in (images, images.reshape(7, 1, 28, 28), images.reshape(7, 28, 28), images.reshape(7, 28, 28, 1)):
        np.testing.assert_array_equal(model.predict(layout), expected)
    assert model.class_names == [str(k) for k in range(10)] and model.image_shape == (1, 28, 28)


@pytest.mark.parametrize("call, fragment", [
    (lambda tmp: train("adam_mnst", runs_dir=tmp), "adam_mnst: no such config file or built-in config"),
    (lambda tmp: train({"optim": {"lr": -1}}, runs_dir=tmp), "optim.lr"),
    (lambda tmp: train("adam_mnist", ["train.epochs=0"], runs_dir=tmp), "train.epochs"),
    (lambda tmp: load(tmp / "nothing"), "no such run directory"),
])
def test_mistakes_are_one_line_user_errors_and_write_nothing(tmp_path, call, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        call(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_predict_refuses_images_of_another_shape(run):
    with pytest.raises(UserError, match=r"images: images of shape \(2, 32, 32, 3\); the model reads"):
        load(run.run_dir).predict(np.zeros((2, 32, 32, 3), np.uint8))
