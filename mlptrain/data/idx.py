"""Reader for the IDX format of the MNIST files, gzip-compressed or raw.

Format (http://yann.lecun.com/exdb/mnist/): two zero bytes, a type code
(0x08 = unsigned byte), the number of dimensions, then each dimension as a
big-endian uint32, then the values in C order. Only unsigned bytes are read:
every dataset mlptrain knows stores pixels and labels that way.

Every malformed input raises `UserError` with one line naming the file.
"""

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from mlptrain.data.download import read_bytes
from mlptrain.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
UBYTE = 0x08
# Other codes of the format, named only to make the error message helpful.
OTHER_TYPES = {0x09: "int8", 0x0B: "int16", 0x0C: "int32", 0x0D: "float32", 0x0E: "float64"}


def read_idx(path: str | Path) -> np.ndarray:
    """The uint8 array stored in the IDX file at `path` (gzip or raw).

    The result is a read-only view of the file's bytes.
    """
    return parse_idx(read_decompressed(path), Path(path))


def read_decompressed(path: str | Path) -> bytes:
    """The bytes of `path`, gunzipped when they start with the gzip magic (see `gunzip_if_gzipped`)."""
    path = Path(path)
    return gunzip_if_gzipped(read_bytes(path), path)


def gunzip_if_gzipped(data: bytes, source: str | Path) -> bytes:
    """`data` decompressed when it starts with the gzip magic, else `data` itself.

    The compression is told from the content, not the suffix, so a raw file
    named `.gz` (or a gzip file without the suffix) still reads.
    """
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    # A damaged stream surfaces as any of these, depending on where the damage is:
    # BadGzipFile (an OSError) for a bad header, CRC or trailing garbage,
    # EOFError for a truncated stream, zlib.error for corrupt deflate data.
    except (OSError, EOFError, zlib.error) as error:
        raise UserError(f"{source}: corrupt or truncated gzip data ({error})") from None


def parse_idx(data: bytes, source: str | Path) -> np.ndarray:
    """Decode IDX bytes (already decompressed) into a read-only uint8 array.

    `source` names the file in error messages.
    """
    if len(data) < 4:
        raise UserError(f"{source}: not an IDX file ({len(data)} bytes, shorter than the 4-byte header)")
    zero, type_code, ndim = struct.unpack_from(">HBB", data)
    if zero != 0:
        raise UserError(f"{source}: not an IDX file (magic {data[:4].hex()} does not start with 0000)")
    if type_code != UBYTE:
        name = OTHER_TYPES.get(type_code, "an unknown type")
        raise UserError(f"{source}: IDX type code 0x{type_code:02x} ({name}) is not supported, "
                        f"only 0x08 (unsigned byte)")
    if ndim == 0:
        raise UserError(f"{source}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UserError(f"{source}: truncated IDX header ({ndim} dimensions need {header} bytes, "
                        f"file has {len(data)})")
    shape = struct.unpack_from(f">{ndim}I", data, 4)
    expected = header + math.prod(shape)  # exact: huge bogus dims must not wrap around
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "trailing bytes after the data"
        raise UserError(f"{source}: {problem}: shape {shape} needs {expected} bytes, file has {len(data)}")
    # frombuffer shares the bytes (no copy); `bytes` are immutable, so the view is read-only.
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)
