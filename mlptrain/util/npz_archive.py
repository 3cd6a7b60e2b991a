"""Reading an .npz archive (a user's inputs, a dataset, a features file, a checkpoint): every way a damaged
one fails becomes one UserError line naming the file.

Damage surfaces in whichever layer meets it first, each with its own exception: the zip directory
(BadZipFile, EOFError, OSError), a member's compressed stream (zlib.error; NotImplementedError for an
unknown method, RuntimeError for a member flagged encrypted), its CRC (BadZipFile), its .npy header
(ValueError, UnicodeDecodeError, tokenize.TokenError from NumPy's header parser). Such a list is one
that damage outgrows (a fuzzed archive found each of these), so everything reading the archive raises
is its refusal; MemoryError alone passes (npz_sizes refuses what cannot fit before anything is loaded).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mlptrain.errors import UserError
from mlptrain.util.npz_sizes import check_npz_sizes
from mlptrain.util.regular_file import open_regular

ZIP_MAGIC, NPY_MAGIC = b"PK", b"\x93NUMPY"
DETAIL_CHARS = 120  # of the decoder's own message: a damaged header may quote kilobytes of itself


@contextmanager
def open_npz(path: Path, what: str, fix: str = ""):
    """The archive at `path` (a `what`: "checkpoint", "features file", ...) as an NpzFile, its array sizes
    checked from their headers first (npz_sizes). Reading its members inside the `with` is covered too: a
    decoding error there is refused as damage. Raises UserError, ending with `; {fix}` where given, for a
    missing or unreadable file, a single .npy, a file that is no zip, or any damage."""
    hint = f"; {fix}" if fix else ""
    try:
        file = open_regular(path)  # a FIFO would block np.load, a device never end
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}{hint}") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err}); a {what} is a regular file") from None
    with file:
        head = _head(path, file)
        if head.startswith(NPY_MAGIC):  # np.load would hand back a bare array
            raise UserError(f"{path}: a single .npy array, not an .npz archive{hint}")
        if not head.startswith(ZIP_MAGIC):  # np.load would try to unpickle it, and say so confusingly
            raise UserError(f"{path}: not an .npz archive (an .npz is a zip file; this one does not start as "
                            f"one){hint}")
        try:
            check_npz_sizes(path, what, file)
            file.seek(0)
            with np.load(file, allow_pickle=False) as npz:
                yield npz
        except (UserError, MemoryError):
            raise
        except Exception as err:  # see the module docstring: damage raises almost any exception
            raise damaged(path, what, err, hint) from None


def damaged(path: Path, what: str, err: Exception, hint: str = "") -> UserError:
    """The refusal of a `what` whose decoding raised `err`: its type and the start of its message."""
    detail = str(err)
    detail = detail if len(detail) <= DETAIL_CHARS else detail[:DETAIL_CHARS] + "..."
    if "allow_pickle" in detail:  # an object array: refused, never unpickled
        return UserError(f"{path}: holds an array of Python objects, which is never loaded (unpickling can run "
                         f"code); a {what} holds numbers and strings{hint}")
    kind = type(err).__name__ if type(err).__module__ == "builtins" else f"{type(err).__module__}.{type(err).__name__}"
    return UserError(f"{path}: not a readable {what}, damaged or truncated ({kind}{': ' + detail if detail else ''})"
                     f"{hint}")


def _head(path: Path, file) -> bytes:
    try:
        head = file.read(len(NPY_MAGIC))
        file.seek(0)
        return head
    except OSError as err:  # EIO on a failing disk, EISDIR cannot reach here (open_regular)
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
