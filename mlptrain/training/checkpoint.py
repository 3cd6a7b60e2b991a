"""Checkpoints: plain named arrays in an .npz, written atomically.

Keys: `params/<name>` for every parameter, `optim/<state>` for the flat
optimizer state, and `meta/<field>` scalars (epoch, global step, ...). Files
load with `np.load(path, allow_pickle=False)`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlptrain.config.safe_yaml import brief_text
from mlptrain.errors import UserError
from mlptrain.util.atomic import atomic_write, write_ahead
from mlptrain.util.npz_archive import open_npz


def save_checkpoint(path: Path, arrays: dict[str, np.ndarray], overwrite: bool = True) -> None:
    """Written atomically (mlptrain.util.atomic, `overwrite` as there): a kill at any instant leaves the
    previous file intact."""
    _folder(path)
    with atomic_write(path, binary=True, overwrite=overwrite) as f:
        np.savez(f, **arrays)


def save_checkpoint_ahead(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """`path`'s checkpoint written to a hidden file beside it, which becomes `path` at util.atomic.commit_ahead
    (write_ahead); returns that file."""
    _folder(path)
    return write_ahead(path, lambda f: np.savez(f, **arrays))


def _folder(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{path.parent}: cannot create it ({err.strerror or err})") from None


# Arrays whose every value must be finite: what training continues from. NaN is allowed where it means
# "none yet" (meta/best_*, plateau/best), in step/grad_norms and in step/state's grad-norm slot (fp16's
# skipped windows record inf/NaN there); OptimizerStep checks the rest of step/state.
FINITE = ("params/", "optim/", "plateau/multiplier", "plateau/bad_evaluations", "meta/epoch",
          "meta/window", "meta/seed")
COUNTERS = ("meta/epoch", "meta/window", "meta/seed", "plateau/bad_evaluations")  # integer scalars >= 0


def load_checkpoint(path: Path) -> dict[str, np.ndarray]:
    """The checkpoint's arrays, each checked to be numbers (no strings or objects), finite where training
    continues from it, and scalar counters where a counter is expected; raises UserError naming the array."""
    with open_npz(path, "checkpoint") as npz:
        arrays = {key: npz[key] for key in npz.files}
    for key, array in arrays.items():
        problem = _problem(key, array)
        if problem:
            raise UserError(f"{path}: {brief_text(key)} {problem}; the checkpoint is damaged or was not written "
                            "by mlptrain")
    return arrays


def _problem(key: str, array: np.ndarray) -> str | None:
    if array.dtype.kind not in "biuf":
        return f"holds {array.dtype} values, not numbers"
    if key.startswith(FINITE) and array.dtype.kind == "f" and not np.isfinite(array).all():
        return "holds NaN or infinite values"
    if key in COUNTERS and (array.shape != () or array.dtype.kind not in "iu" or int(array) < 0):
        return f"must be a whole number >= 0, got a {array.dtype} array of shape {array.shape}"
    return None
