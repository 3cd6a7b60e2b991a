"""`mlptrain cache [info]` shows the kernel cache (folder, entries, size, the last run's hits and misses);
`mlptrain cache clear` empties it."""

from __future__ import annotations

import typer
from rich.table import Table

from mlptrain.errors import UserError
from mlptrain.tracking import console

# kernel_store needs no numba, but importing it imports its package, which does (~1.5 s): lazily
CACHE_ENV = "MLPTRAIN_KERNEL_CACHE"

app = typer.Typer(help="Show or clear the on-disk cache of compiled GPU kernels.", invoke_without_command=True)


@app.callback()
def cache(ctx: typer.Context) -> None:
    """Show the kernel cache (same as `mlptrain cache info`)."""
    if ctx.invoked_subcommand is None:
        info()


@app.command()
def info() -> None:
    """Where the kernel cache is, what it holds, and what the last training process did with it."""
    from mlptrain.numba_kernels.kernel_store import KernelStore, default_dir

    root = default_dir()
    if root is None:
        console.print(f"kernel cache: off ({CACHE_ENV}=off); every process compiles its kernels")
        return
    check_folder(root)
    store = KernelStore(root)
    entries = store.entries()
    table = Table("", "", show_header=False, title=f"kernel cache (set {CACHE_ENV} to move or turn it off)")
    table.add_row("folder", str(root))
    table.add_row("entries", f"{len(entries):,}")
    table.add_row("size", f"{store.size() / 2**20:.1f} MiB")
    last = store.last_run()
    if last:
        table.add_row("last run", f"{last.get('run', '?')} at {last.get('at', '?')}")
        table.add_row("  compiled", f"{last.get('compiled', 0)} ({last.get('compile_s', 0):.1f} s, "
                                    f"{last.get('compiled_ahead', 0)} of them ahead by {last.get('workers', 0)} workers)")
        table.add_row("  from cache", f"{last.get('from_cache', 0)} ({last.get('load_s', 0):.2f} s)")
    console.print(table)


@app.command()
def clear() -> None:
    """Remove every compiled kernel from the cache; the next run compiles them again."""
    from mlptrain.numba_kernels.kernel_store import KernelStore, default_dir

    root = default_dir()
    if root is None:
        console.print(f"kernel cache: off ({CACHE_ENV}=off); nothing to clear")
        return
    check_folder(root)
    try:
        removed = KernelStore(root).clear()
    except OSError as err:
        raise UserError(f"cache clear: {root} could not be emptied ({err.strerror or err})") from None
    console.print(f"removed {removed:,} kernels from {root}")


def check_folder(root) -> None:
    """The cache is a folder (or not made yet); a file there would read as an empty cache."""
    if root.exists() and not root.is_dir():
        raise UserError(f"kernel cache {root}: not a folder; set {CACHE_ENV} to a folder (or off)")
