"""`mlptrain cache [info]` shows mlptrain's two caches: compiled GPU kernels (folder, entries, size, the
last run's hits and misses) and decoded datasets; `mlptrain cache clear [--kernels|--data]` empties them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import typer
from rich.table import Table

from mlptrain.backends.kernel_cache.store import CACHE_ENV, KernelStore, default_dir
from mlptrain.errors import UserError
from mlptrain.util.console import console
from mlptrain.util.read_numbers import finite_float

app = typer.Typer(help="Show or clear the on-disk caches: compiled GPU kernels and decoded datasets.",
                  invoke_without_command=True)


@app.callback()
def cache(ctx: typer.Context) -> None:
    """Show both caches (same as `mlptrain cache info`)."""
    if ctx.invoked_subcommand is None:
        info()


@app.command()
def info() -> None:
    """Where each cache is, what it holds, and what the last training process did with the kernel cache."""
    from mlptrain.data import decoded_cache  # here: the data package imports every parser, a cost other commands skip

    root, data = default_dir(), decoded_cache.cache_dir()
    for folder, what, env in ((root, "kernel cache", CACHE_ENV), (data, "data cache", decoded_cache.CACHE_ENV)):
        if folder is not None:  # both before either is shown: the error is then the one line on stderr
            check_folder(folder, what, env)
    if root is None:
        console.print(f"kernel cache: off ({CACHE_ENV}=off); every process compiles its kernels")
    else:
        store = KernelStore(root)
        table = Table("", "", show_header=False, title=f"kernel cache (set {CACHE_ENV} to move or turn it off)")
        table.add_row("folder", str(root))
        table.add_row("entries", f"{len(store.entries()):,}")
        table.add_row("size", f"{store.size() / 2**20:.1f} MiB")
        last = store.last_run()
        if last:
            table.add_row("last run", f"{last.get('run', '?')} at {last.get('at', '?')}")
            # read back from a file: a number is shown only once it is a finite float (10**400 cannot be one)
            compile_s, load_s = (finite_float(last.get(key)) or 0.0 for key in ("compile_s", "load_s"))
            table.add_row("  compiled", f"{last.get('compiled', 0)} ({compile_s:.1f} s, "
                                        f"{last.get('compiled_ahead', 0)} of them ahead by "
                                        f"{last.get('workers', 0)} workers)")
            table.add_row("  from cache", f"{last.get('from_cache', 0)} ({load_s:.2f} s)")
        console.print(table)
    if data is None:
        console.print(f"data cache: off ({decoded_cache.CACHE_ENV}=off); every run decodes its dataset's files")
        return
    entries = decoded_cache.entries(data)
    table = Table("", "", show_header=False,
                  title=f"decoded-data cache (set {decoded_cache.CACHE_ENV} to move or turn it off)")
    table.add_row("folder", str(data))
    names = sorted({p.name.rsplit("-", 1)[0] for p in entries})  # one entry per dataset folder (and label set)
    table.add_row("entries", f"{len(entries):,}" + (f" ({', '.join(names)})" if names else ""))
    table.add_row("size", f"{sum(size(p) for p in entries) / 2**20:.1f} MiB")
    console.print(table)


@app.command()
def clear(kernels: bool = typer.Option(False, "--kernels", help="only the compiled kernels"),
          data: bool = typer.Option(False, "--data", help="only the decoded datasets")) -> None:
    """Empty both caches (or the one named); the next run compiles its kernels and decodes its data again."""
    from mlptrain.data import decoded_cache  # here: the data package imports every parser, a cost other commands skip

    both = not (kernels or data)
    roots = []  # (what, folder, env, empty it): both checked before either is emptied
    if kernels or both:
        roots.append(("kernel cache", default_dir(), CACHE_ENV, lambda root: KernelStore(root).clear(), "kernels"))
    if data or both:
        roots.append(("data cache", decoded_cache.cache_dir(), decoded_cache.CACHE_ENV, decoded_cache.clear,
                      "decoded datasets"))
    for what, root, env, _, _ in roots:
        if root is not None:
            check_folder(root, what, env)
    for what, root, env, clear_it, things in roots:
        if root is None:
            console.print(f"{what}: off ({env}=off); nothing to clear")
        else:
            removed = emptied(lambda: clear_it(root), root)
            console.print(f"removed {removed:,} {things} from {root}", highlight=False)


def emptied(clear_it, root: Path) -> int:
    try:
        return clear_it()
    except OSError as err:
        raise UserError(f"cache clear: {root} could not be emptied ({err.strerror or err})") from None


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # removed by a `clear` running beside this
        return 0


def check_folder(root: Path, what: str, env: str) -> None:
    """The cache is a folder (or not made yet). A file there would read as an empty cache, and so would a
    path that can never be a folder (a symlink loop, a path through a file, a name too long): os.stat says
    which, where Path.exists() answers False for some of them and raises for others."""
    try:
        mode = os.stat(root).st_mode
    except FileNotFoundError:
        return  # made by the first run that writes it
    except OSError as err:
        raise UserError(f"{what} {root}: cannot be a folder ({err.strerror or err}); "
                        f"set {env} to a folder (or off)") from None
    if not stat.S_ISDIR(mode):
        raise UserError(f"{what} {root}: not a folder; set {env} to a folder (or off)")
