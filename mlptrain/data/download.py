"""Download a file from a list of mirrors, verify its md5, and put it in place atomically."""

import contextlib
import hashlib
import http.client
import urllib.error
from pathlib import Path

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from mlptrain.errors import DataNotFound, UserError
from mlptrain.util.atomic import replacing
from mlptrain.util.console import make_console
from mlptrain.util.regular_file import open_regular, read_regular_bytes

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 30.0


class _MirrorFailed(Exception):
    """One mirror did not deliver the file; the next one may."""


def md5sum(path: str | Path) -> str:
    """Hex md5 of the file at `path`, read in chunks (never whole into memory)."""
    digest = hashlib.md5()
    with open_regular(path) as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def read_bytes(path: Path) -> bytes:
    """The whole content of the file at `path`; an OSError becomes one `UserError` line naming it."""
    try:
        return read_regular_bytes(path)  # a FIFO in the data folder would block, a device never end
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror or error})") from None


def fetch(urls: list[str], dest: Path, md5: str | set[str], *, timeout: float = TIMEOUT_S,
          opener=None) -> None:
    """Download `dest` from the first of `urls` that delivers bytes whose md5 is `md5`
    (or one of the set), trying each in turn.

    The bytes stream into a hidden temporary file beside `dest`, which is renamed
    to `dest` only once verified: `dest` is either absent or complete, and no
    temporary file outlives the call (also on Ctrl-C). `opener` defaults to
    `urllib.request.urlopen`, looked up at call time so tests can replace it.
    Raises `UserError` naming `dest` when no mirror delivers the file or the
    folder cannot be written.
    """
    import urllib.request  # here: http, ssl and email take ~15 ms to import, and only a download needs them

    dest = Path(dest)
    expected = {md5} if isinstance(md5, str) else set(md5)
    failures = []
    created = not dest.parent.exists()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        for url in urls:
            try:
                _fetch_one(url, dest, expected, timeout, opener or urllib.request.urlopen)
                return
            except _MirrorFailed as failure:
                failures.append(f"{url}: {failure}")
    except OSError as error:
        # Network errors became _MirrorFailed inside _fetch_one: what is left is local.
        raise UserError(f"cannot write {dest} ({error.strerror or error})") from None
    if created:  # leave no empty folder behind a failed download
        with contextlib.suppress(OSError):
            dest.parent.rmdir()
    raise UserError(f"could not download {dest.name}: " + "; ".join(failures or ["no mirror given"]))


def _fetch_one(url: str, dest: Path, expected: set[str], timeout: float, opener) -> None:
    """Stream `url` into a temporary file beside `dest`, check its md5, rename it to `dest`."""
    with replacing(dest) as out:  # durable: the md5 is checked here, not each time the file is read
        digest = _stream(url, out, dest.name, timeout, opener)
        if digest not in expected:  # leaves the block by raising: the temporary file goes, dest stays as it was
            raise _MirrorFailed(f"md5 {digest} does not match the expected {' or '.join(sorted(expected))}")


def _stream(url: str, out, label: str, timeout: float, opener) -> str:
    """Copy the body of `url` into the open file `out`; return its hex md5."""
    digest = hashlib.md5()
    try:
        response = opener(url, timeout=timeout)
    except (OSError, http.client.HTTPException, ValueError) as error:  # ValueError: malformed URL
        raise _MirrorFailed(_describe(error)) from None
    with response, _progress(url) as progress:
        size = response.headers.get("Content-Length") if response.headers else None
        task = progress.add_task(label, total=int(size) if size and size.isdigit() else None)
        while True:
            try:
                chunk = response.read(CHUNK_BYTES)
            except (OSError, http.client.HTTPException) as error:
                raise _MirrorFailed(_describe(error)) from None
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)  # an OSError here is local (disk full): fetch reports it as such
            progress.advance(task, len(chunk))
    return digest.hexdigest()


def _progress(url: str) -> Progress:
    """A transient download bar on stderr; a plain log line instead when stderr is not a terminal."""
    # stderr so a piped stdout (result tables) stays clean; transient so a finished
    # download leaves no bar behind. Off a terminal a bar would only leave a stray
    # newline, while one line saying what is being fetched helps a CI log.
    console = make_console()
    if not console.is_terminal:
        console.print(f"downloading {url}", markup=False, highlight=False, soft_wrap=True)
    return Progress(TextColumn("downloading {task.description}"), BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), console=console, transient=True, disable=not console.is_terminal)


def _describe(error: BaseException) -> str:
    """A short reason for a failed request, without urllib's `<urlopen error ...>` wrapping."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    if isinstance(error, TimeoutError):
        return "timed out"
    return str(error) or type(error).__name__


def prepare_folder(folder: Path) -> list[Path]:
    """Create `folder` (and its parents) for a download, or raise `UserError` saying it cannot be. Returns
    the folders this call created, deepest first, for `remove_empty` after a failed download."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot create {folder} for the download ({error.strerror or error}); "
                        f"set MLPTRAIN_DATA_DIR (or data.root) to a writable folder") from None
    return created


def remove_empty(folders: list[Path]) -> None:
    """Remove the folders a failed download created (deepest first) that are still empty: an offline
    attempt (or one pointed at the wrong data root) leaves no empty dataset folder behind."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty (a file arrived), or already gone: kept as it is
            folder.rmdir()


def offline_error(title: str, folder: Path, error: UserError, files: list[tuple[str, str]],
                  note: str = "") -> DataNotFound:
    """What to do when `title` could not be downloaded into `folder`: each of
    `files` (name, url) to put there, a `note` line, and the data-root alternative, one per line (each
    value flattened to one line, so that only these line breaks remain)."""
    def flat(value) -> str:
        return " ".join(str(value).splitlines())

    listing = "".join(f"\n  {flat(name)}  from {flat(url)}" for name, url in files)
    return DataNotFound(
        f"{title} could not be downloaded ({flat(error)})\n"
        f"put {'this file' if len(files) == 1 else 'these files'} into {flat(folder)}:{listing}\n"
        + (f"{flat(note)}\n" if note else "")
        + f"or set MLPTRAIN_DATA_DIR (or data.root) to a folder that holds {flat(folder.name)}/")
