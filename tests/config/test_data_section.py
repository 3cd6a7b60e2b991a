"""The config's data section: every dataset of the table, and the keys that go with some of them."""

import dataclasses

import pytest
import yaml

from mlptrain.config.load import config_from_dict, load_config
from mlptrain.config.schema import DataConfig
from mlptrain.data import DATASETS
from mlptrain.errors import UserError


def test_dataset_choices_are_the_registry():
    field = next(f for f in dataclasses.fields(DataConfig) if f.name == "dataset")
    assert field.metadata["choices"] == tuple(DATASETS)


@pytest.mark.parametrize("data", [
    {"dataset": "fashion_mnist"}, {"dataset": "kmnist", "root": "/data"}, {"dataset": "cifar100"},
    {"dataset": "cifar100", "label": "coarse"}, {"dataset": "cifar100", "label": None},
    {"dataset": "npz", "path": "my.npz"}, {"dataset": "folder", "path": "pictures"},
])
def test_valid_data_sections(data):
    config = config_from_dict({"data": data})
    assert {key: getattr(config.data, key) for key in data} == data


@pytest.mark.parametrize("data, message", [
    ({"dataset": "fashion"}, "data.dataset: 'fashion' is not one of mnist, fashion_mnist, kmnist, cifar10, cifar100, "
                             "npz, folder"),
    ({"dataset": "npz"}, "data.dataset npz needs data.path: the .npz file, e.g. data.path=my.npz"),
    ({"dataset": "folder"}, "data.dataset folder needs data.path: the folder holding train/<class>/*.png"),
    ({"dataset": "mnist", "path": "x.npz"}, "data.path is for data.dataset npz or folder; mnist is read from data.root"),
    ({"dataset": "cifar10", "label": "coarse"}, "data.label chooses CIFAR-100's fine or coarse labels; cifar10 has "
                                                "one set of labels: drop data.label"),
    ({"dataset": "cifar100", "label": "medium"}, "data.label: 'medium' is not one of fine, coarse"),
    ({"dataset": "npz", "path": 3}, "data.path: expected str, got 3"),
])
def test_invalid_data_sections(data, message):
    with pytest.raises(UserError) as caught:
        config_from_dict({"data": data}, source="c.yaml")
    assert str(caught.value) == f"c.yaml: {message}" or message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_resolved_section_of_a_run_is_not_read_back(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"data": {"dataset": "cifar10"}, "resolved": {"dataset": {"name": "cifar10",
                                                                                            "subset": True}}}))
    assert load_config(path).data.dataset == "cifar10"
