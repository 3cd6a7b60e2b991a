"""Reader for the python-pickle batch files of CIFAR-10 (`data_batch_1`, ..., `test_batch`) and
CIFAR-100 (`train`, `test`).

Format (https://www.cs.toronto.edu/~kriz/cifar.html): each file is a pickled
dict whose `b"data"` is a uint8 array of shape (N, 3072), one row per image
holding the red, green and blue 32x32 planes in turn, and whose labels entry
is a list of N ints: `b"labels"` in 0..9 for CIFAR-10, `b"fine_labels"` in
0..99 and `b"coarse_labels"` in 0..19 for CIFAR-100. The canonical files hold
10,000 (CIFAR-10), 50,000 and 10,000 (CIFAR-100) images; any N >= 1 is
accepted, because subsets keep the format but not the count.

Unpickling can call any importable function, so the batches are read by an
unpickler that resolves only the few names a batch needs and refuses the rest.
Every malformed input raises `UserError` with one line naming the file.
"""

import io
import pickle
from pathlib import Path

import numpy as np

from mlptrain.data.download import read_bytes
from mlptrain.errors import UserError

IMAGE_SHAPE = (3, 32, 32)
FEATURES = 3 * 32 * 32
NUM_CLASSES = 10


class _Refused(pickle.UnpicklingError):
    """The pickle asked for a name outside the allow-list."""


def _latin1_encode(text, encoding="latin1"):
    """`_codecs.encode` narrowed to the one use pickle makes of it: Python 3
    protocols 0-2 store bytes as `_codecs.encode(text, "latin1")`."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


# Taken from ndarray's own pickling, so each resolves to whatever this numpy
# version names them, whether the file says `numpy.core` (numpy 1) or `numpy._core` (numpy 2).
_RECONSTRUCT = np.empty(0).__reduce__()[0]  # protocols 0-4: _reconstruct(ndarray, shape, dtype) + setstate
_FROMBUFFER = np.empty(0).__reduce_ex__(5)[0]  # protocol 5: _frombuffer(buffer, dtype, shape, order)

ALLOWED = {
    **{(module, "_reconstruct"): _RECONSTRUCT for module in ("numpy.core.multiarray", "numpy._core.multiarray")},
    **{(module, "_frombuffer"): _FROMBUFFER for module in ("numpy.core.numeric", "numpy._core.numeric")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
    **{(module, kind.__name__): kind for module in ("builtins", "__builtin__")
       for kind in (dict, list, bytes, str, int)},
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None


def read_cifar_batch(path: str | Path, labels_key: str = "labels",
                     num_classes: int = NUM_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) of the CIFAR batch file at `path`: images uint8 (N, 3072)
    C-contiguous, labels uint8 (N,) from the entry `labels_key`, in 0..num_classes-1, N >= 1."""
    path = Path(path)
    return parse_cifar_batch(read_bytes(path), path, labels_key, num_classes)


def parse_cifar_batch(data: bytes, path: Path, labels_key: str = "labels",
                      num_classes: int = NUM_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """`read_cifar_batch` of the file's bytes `data`, already read (`path` names it in refusals)."""
    try:
        stream = io.BytesIO(data)
        # encoding="bytes": the canonical files come from Python 2, whose str is bytes.
        batch = _BatchUnpickler(stream, encoding="bytes").load()
        trailing = stream.read(1)
    except _Refused as refused:
        raise UserError(f"{path}: refused to unpickle {refused}: a CIFAR batch needs only dicts, lists, "
                        f"bytes, ints and numpy arrays (the file may be malicious)") from None
    # Damaged pickle data surfaces as almost any exception (UnpicklingError, EOFError,
    # ValueError, TypeError, KeyError, IndexError, struct.error, UnicodeDecodeError,
    # numpy's errors, ...) depending on which byte is wrong; all mean the same here.
    except Exception as error:
        raise UserError(f"{path}: corrupt or truncated pickle ({type(error).__name__}: {error})") from None
    if trailing:
        raise UserError(f"{path}: trailing bytes after the pickled batch")
    return _validate(batch, path, labels_key, num_classes)


def _validate(batch, path: Path, labels_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Check the unpickled object has the canonical structure; return it as uint8 arrays."""
    if not isinstance(batch, dict):
        raise UserError(f"{path}: not a CIFAR batch (a pickled {type(batch).__name__}, expected a dict)")
    data, labels = _entry(batch, "data", path), _entry(batch, labels_key, path)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != FEATURES:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise UserError(f"{path}: b'data' must be a uint8 array of shape (N, {FEATURES}), got {got}")
    rows = data.shape[0]
    if rows == 0:
        raise UserError(f"{path}: b'data' holds no images")
    try:
        labels = np.asarray(labels)
    except (ValueError, TypeError) as error:  # ragged nesting
        raise UserError(f"{path}: b'{labels_key}' is not a list of ints ({error})") from None
    if labels.dtype.kind not in "iu" or labels.shape != (rows,):
        raise UserError(f"{path}: b'{labels_key}' must be {rows} ints (one per image), "
                        f"got {labels.dtype} {labels.shape}")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise UserError(f"{path}: b'{labels_key}' must be in 0..{num_classes - 1}, "
                        f"found {labels.min()}..{labels.max()}")
    return np.ascontiguousarray(data), labels.astype(np.uint8)


def _entry(batch: dict, key: str, path: Path):
    """batch[b"key"], or batch["key"] in a file re-pickled from a dict loaded with text keys."""
    for candidate in (key.encode(), key):
        if candidate in batch:
            return batch[candidate]
    raise UserError(f"{path}: not a CIFAR batch (no {key.encode()!r} entry; keys: "
                    f"{', '.join(sorted(map(repr, batch)))[:200]})")
