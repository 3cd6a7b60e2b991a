"""The table of built-in datasets: names, files, published checksums, mirrors, shapes and classes.

Adding an MNIST-like or CIFAR-like dataset is one entry here. Mean and std are not in
the table: they are computed from each dataset's training images when it is loaded
(`mlptrain.data.dataset.value_statistics`).

Where each checksum comes from:
- MNIST, Fashion-MNIST, KMNIST `.gz` md5s: torchvision's `torchvision/datasets/mnist.py`
  (`MNIST.resources`, `FashionMNIST.resources`, `KMNIST.resources`); Fashion-MNIST's are also
  the table in github.com/zalandoresearch/fashion-mnist README.md ("Get the Data").
  MNIST's md5s of the decompressed files are the ones this project has checked since its first
  loader, also listed in ../shared/datasets/README.md; tests/data/test_mnist_family.py checks
  them against the real files. They let a re-compressed or un-gzipped copy verify.
- CIFAR-10 and CIFAR-100 archive and batch md5s: torchvision's `torchvision/datasets/cifar.py`
  (`tgz_md5`, `train_list`, `test_list`, `meta`).
Mirrors: the URLs those files download from (torchvision's `mirrors` / `url`; the Fashion-MNIST
README's links and its repository's `data/fashion/`; the KMNIST README, github.com/rois-codh/kmnist).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataFile:
    """A file of a dataset: its name (IDX: without `.gz`; the download is `name.gz`), the published md5
    of what is downloaded, and where known the md5 of the decompressed content."""

    name: str
    md5: str
    content_md5: str | None = None


@dataclass(frozen=True)
class LabelSet:
    """One way of labelling the images: chosen by `data.label` (None: the dataset's only one), read
    from the pickle entry `key` (CIFAR) or the labels file (IDX)."""

    label: str | None
    key: str | None
    class_names: tuple[str, ...]


@dataclass(frozen=True)
class BuiltinDataset:
    name: str  # data.dataset, and the folder under the data root
    title: str
    layout: str  # "idx": four IDX files; "cifar": python-pickle batches in an archive
    mirrors: tuple[str, ...]  # idx: base URLs the file names are appended to; cifar: the archive's URLs
    train: tuple[DataFile, ...]  # idx: (images, labels); cifar: the training batches
    test: tuple[DataFile, ...]
    image_shape: tuple[int, int, int]  # (C, H, W)
    sizes: tuple[int, int]  # (training, test) images as published: fewer means a subset
    label_sets: tuple[LabelSet, ...]  # the first is the default
    archive: DataFile | None = None  # cifar: the .tar.gz
    batch_folder: str | None = None  # cifar: the folder the archive unpacks
    other_members: tuple[str, ...] = ()  # cifar: the archive's other files (extracted, not read)

    @property
    def num_classes(self) -> int:
        return len(self.label_sets[0].class_names)

    def label_set(self, label: str | None) -> LabelSet:
        """The label set `data.label` picks; raises KeyError for one the dataset lacks."""
        if label is None:
            return self.label_sets[0]
        return next(s for s in self.label_sets if s.label == label)


MNIST_FAMILY_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                      "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _idx_dataset(name, title, mirrors, md5s, class_names, content_md5s=(None,) * 4) -> BuiltinDataset:
    files = [DataFile(f, md5, content) for f, md5, content in zip(MNIST_FAMILY_NAMES, md5s, content_md5s)]
    return BuiltinDataset(name, title, "idx", mirrors, tuple(files[:2]), tuple(files[2:]), (1, 28, 28),
                          (60_000, 10_000), (LabelSet(None, None, tuple(class_names)),))


CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR100_FINE = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle", "bowl", "boy",
    "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock",
    "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish",
    "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange",
    "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
    "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk",
    "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
    "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
    "willow_tree", "wolf", "woman", "worm",
)
CIFAR100_COARSE = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables", "household_electrical_devices",
    "household_furniture", "insects", "large_carnivores", "large_man-made_outdoor_things",
    "large_natural_outdoor_scenes", "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates",
    "people", "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
)

BUILTIN = {d.name: d for d in (
    _idx_dataset(
        "mnist", "MNIST",
        # torchvision's mirror first: the original site often refuses scripted downloads
        ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
        ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
         "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"),
        tuple("0123456789"),
        ("6bbc9ace898e44ae57da46a324031adb", "a25bea736e30d166cdddb491f175f624",
         "2646ac647ad5339dbf082846283269ea", "27ae3e4e09519cfbb04c329615203637"),
    ),
    _idx_dataset(
        "fashion_mnist", "Fashion-MNIST",
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
         "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"),
        ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
         "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"),
        ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
    ),
    _idx_dataset(
        "kmnist", "Kuzushiji-MNIST",
        ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",),
        ("bdb82020997e1d708af4cf47b453dcf7", "e144d726b3acfaa3e44228e80efcd344",
         "5c965bf0a639b31b8f53240b1b52f4d7", "7320c461ea6c1c855c0b718fb2a4b134"),
        # the romanised hiragana of kmnist_classmap.csv, as torchvision's KMNIST.classes
        ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"),
    ),
    BuiltinDataset(
        "cifar10", "CIFAR-10", "cifar", ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
        train=(DataFile("data_batch_1", "c99cafc152244af753f735de768cd75f"),
               DataFile("data_batch_2", "d4bba439e000b95fd0a9bffe97cbabec"),
               DataFile("data_batch_3", "54ebc095f3ab1f0389bbae665268c751"),
               DataFile("data_batch_4", "634d18415352ddfa80567beed471001a"),
               DataFile("data_batch_5", "482c414d41f54cd18b22e5b47cb7c3cb")),
        test=(DataFile("test_batch", "40351d587109b95175f43aff81a1287e"),),
        image_shape=(3, 32, 32), sizes=(50_000, 10_000), label_sets=(LabelSet(None, "labels", CIFAR10_CLASSES),),
        archive=DataFile("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),
        batch_folder="cifar-10-batches-py", other_members=("batches.meta", "readme.html"),
    ),
    BuiltinDataset(
        "cifar100", "CIFAR-100", "cifar", ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
        train=(DataFile("train", "16019d7e3df5f24257cddd939b257f8d"),),
        test=(DataFile("test", "f0ef6b0ae62326f3e7ffdfab6717acfc"),),
        image_shape=(3, 32, 32), sizes=(50_000, 10_000),
        label_sets=(LabelSet("fine", "fine_labels", CIFAR100_FINE), LabelSet("coarse", "coarse_labels", CIFAR100_COARSE)),
        archive=DataFile("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"),
        # `file.txt~` is an editor's backup the canonical archive happens to hold
        batch_folder="cifar-100-python", other_members=("meta", "file.txt~"),
    ),
)}

# Datasets a user brings: `data.path` names the file or folder.
USER_FORMATS = ("npz", "folder")
