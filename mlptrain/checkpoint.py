"""Checkpoints: plain named arrays in an .npz, written atomically.

Keys: `params/<name>` for every parameter, `optim/<state>` for the flat
optimizer state, and `meta/<field>` scalars (epoch, global step, ...). Files
load with `np.load(path, allow_pickle=False)`.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from mlptrain.atomic import atomic_write
from mlptrain.errors import UserError


def save_checkpoint(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Written atomically (mlptrain.atomic): a kill at any instant leaves the previous file intact."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{path.parent}: cannot create it ({err.strerror or err})") from None
    with atomic_write(path, binary=True) as f:
        np.savez(f, **arrays)


def load_checkpoint(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise UserError(f"{path}: no such checkpoint") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise UserError(f"{path}: not a readable checkpoint ({err})") from None
