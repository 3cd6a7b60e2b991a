"""The features walk-through of docs/features.md, its commands run one after another as written; its second
SVM once refused to replace the first's report (issue 35). The page's run trains here on a small .npz of
CIFAR-shaped images (an SVM on 5,000 CIFAR images takes minutes on the CPU): the order and the names of
the outputs are what is checked, not the fits."""

import shlex
from pathlib import Path

import numpy as np

from tests.cli.test_cli import mlptrain

REPO = Path(__file__).resolve().parents[2]


def walkthrough() -> list[list[str]]:
    """The commands of the page's block that trains `ae` and classifies its features, in order."""
    lines = (REPO / "docs" / "features.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().endswith("--name ae"))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("    mlptrain "):
            break
        block.append(shlex.split(line, comments=True)[1:])
    return block


def test_the_features_walkthrough_runs_as_written(tmp_path):
    rng = np.random.default_rng(0)
    images = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)  # noqa: E731
    np.savez(tmp_path / "small.npz", x_train=images(120), y_train=np.arange(120) % 4, x_test=images(40),
             y_test=np.arange(40) % 4)
    lines = (REPO / "docs" / "features.md").read_text().splitlines()
    run = shlex.split(next(line for line in lines if line.strip().endswith("--name ae")))[1:]
    small = ["backend=cpu", "train.epochs=1", "model.channels=[4,4]", "data.dataset=npz", "data.path=small.npz",
             "data.val_size=20"]
    result = mlptrain(*run, *small, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    commands = walkthrough()
    assert [c[0] for c in commands] == ["extract-features", "svm"] * 3
    for args in commands:
        result = mlptrain(*args, cwd=tmp_path)
        assert result.returncode == 0, f"mlptrain {shlex.join(args)}: {result.stderr}"
    for made in ("runs/ae/features.npz", "runs/ae/features.svm.json", "pixels.npz", "pixels.svm.json",
                 "pooled.npz", "pooled.svm.json"):  # as the page's comments name them
        assert (tmp_path / made).is_file(), made
