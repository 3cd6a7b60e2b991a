"""The built-in CIFAR table: the archives and batches as published, CIFAR-100's label sets."""

import pytest

from mlptrain.data.registry import BUILTIN
from tests.data.test_cifar import CIFAR100, batch_files


# Transcribed from torchvision's torchvision/datasets/cifar.py (tgz_md5, train_list, test_list).
PUBLISHED = {
    "cifar10": ("c58f30108f718f92721af3b95e74349a", {
        "data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e"}),
    "cifar100": ("eb9058c3a382ffc7106e4002c42a8d85", {
        "train": "16019d7e3df5f24257cddd939b257f8d", "test": "f0ef6b0ae62326f3e7ffdfab6717acfc"}),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_table_matches_published_md5s(name):
    spec = BUILTIN[name]
    archive_md5, batches = PUBLISHED[name]
    assert spec.archive.md5 == archive_md5
    assert {f.name: f.md5 for f in batch_files(spec)} == batches
    assert spec.mirrors[0] == f"https://www.cs.toronto.edu/~kriz/{spec.archive.name}"


def test_cifar100_class_names():
    fine, coarse = CIFAR100.label_sets
    assert (fine.label, fine.key, len(fine.class_names)) == ("fine", "fine_labels", 100)
    assert (coarse.label, coarse.key, len(coarse.class_names)) == ("coarse", "coarse_labels", 20)
    assert list(fine.class_names) == sorted(fine.class_names)  # the canonical names are in alphabetical order
    assert len(set(fine.class_names)) == 100 and fine.class_names[-1] == "worm"
