"""An .npz archive's arrays checked from their headers before any is loaded.

`np.load` allocates the shape an array's header declares before it reads a byte of the data, so a
crafted file of a few hundred bytes can ask for terabytes (a MemoryError traceback, or the machine
swapping). Each member's header is read first: an array that declares more bytes than the archive holds
for it is damaged or crafted, and arrays that together exceed the memory available now cannot be loaded.
Every reader of a user's .npz (datasets, `predict` inputs, features files, checkpoints) checks this first.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from mlptrain.errors import UserError
from mlptrain.util.host_memory import HEADROOM, gib, host_available

HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def check_npz_sizes(path: Path, what: str = "", file=None) -> None:
    """Raise UserError (naming `path` and the array) when an array of the archive declares more bytes than
    it holds, or all of them more than the host memory available, or a member is no .npy at all; `file`, when
    given, is `path` opened for reading. A file that is no readable zip, or a header this cannot read, is left
    for np.load to report (mlptrain.util.npz_archive reads every archive and refuses what it raises)."""
    try:
        archive = zipfile.ZipFile(path if file is None else file)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return
    total = 0
    with archive:
        for info in archive.infolist():
            if not _holds_npy(archive, info):  # np.load hands such a member back as bytes, not an array
                raise UserError(f"{path}: member '{info.filename}' is not a NumPy array (.npy); the "
                                f"{what or 'file'} is damaged or was not written by np.savez")
            declared = _declared_bytes(archive, info)
            if declared is None:
                continue
            nbytes, header, shape, dtype = declared
            if nbytes > info.file_size - header:
                name = info.filename.removesuffix(".npy")
                raise UserError(f"{path}: array '{name}' declares shape {shape} of {dtype} ({gib(nbytes)}) but the "
                                f"file holds {max(info.file_size - header, 0):,} bytes of it; the {what or 'file'} "
                                "is damaged or truncated")
            total += nbytes
    free = host_available()
    if free is not None and total > HEADROOM * free:
        raise UserError(f"{path}: its arrays take {gib(total)} in memory and {gib(free)} is available; "
                        f"use a smaller {what or 'file'}")


def _holds_npy(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """Whether the member starts as an .npy does; one that cannot be read is left for np.load to report."""
    if info.is_dir():
        return False
    try:
        with archive.open(info) as member:
            return member.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):
        return True


def _declared_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo):
    """(bytes the member's header declares, the header's length, shape, dtype), or None when it is no
    .npy member or its header is not one of the versions read here."""
    if not info.filename.endswith(".npy"):
        return None
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            reader = HEADER_READERS.get(version)
            if reader is None:
                return None
            shape, _, dtype = reader(member)
            header = member.tell()
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):
        return None
    if dtype.hasobject:
        return None  # never loaded: np.load refuses pickled objects, and each reader says so
    return math.prod(shape) * dtype.itemsize, header, shape, dtype
