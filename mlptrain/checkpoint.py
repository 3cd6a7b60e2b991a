"""Checkpoints: plain named arrays in an .npz, written atomically.

Keys: `params/<name>` for every parameter, `optim/<state>` for the flat
optimizer state, and `meta/<field>` scalars (epoch, global step, ...). Files
load with `np.load(path, allow_pickle=False)`.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from mlptrain.errors import UserError


def save_checkpoint(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Temporary file, flush, fsync, rename: a kill at any instant leaves the previous file intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise UserError(f"{path}: no such checkpoint") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise UserError(f"{path}: not a readable checkpoint ({err})") from None
