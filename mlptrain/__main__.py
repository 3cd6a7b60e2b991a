"""The `mlptrain` command's entry (`python -m mlptrain` and the installed script): its first steps, before it
imports anything else, then the CLI (mlptrain.cli). Importing this module runs nothing (tests/test_imports.py).

The command ends with `os._exit` once Python's own exit steps have run: its threads joined, every atexit
handler (logging's, tensorboardX's, Optuna's), its standard streams flushed. What that skips is the
interpreter's teardown of its modules, which frees memory the system frees anyway and took 0.1-0.15 s with
NumPy, Optuna and SQLAlchemy loaded (benchmarks/NOTES.md, issue 29): a tenth of a second off every command."""

import atexit
import os
import sys

EXIT_CODE: list[int] = []  # the command's exit code, once it has returned one


def main() -> None:
    atexit.register(end_now)  # first, so that it runs last, after every handler registered later
    # first, before the CLI's imports (0.1-0.2 s): a multi-GPU sweep forks its process per GPU, and the
    # commands that train start the CUDA driver meanwhile (mlptrain.sweep.prefork)
    from mlptrain.sweep.prefork import start_early

    waiting = start_early(sys.argv)
    # the CLI, imported once the driver starts: Typer, rich and the commands' modules
    from mlptrain.cli import main as command

    if waiting is not None:  # a child forked above: it waits for the sweep command's call, runs it, and exits
        # imported here: only such a child runs it
        from mlptrain.cli.sweep import serve_planned

        serve_planned(waiting)
    try:
        command()
    except SystemExit as done:  # how the CLI always ends (mlptrain.cli.main)
        if done.code is None or isinstance(done.code, int):
            EXIT_CODE.append(done.code or 0)
        raise


def end_now() -> None:
    """The last atexit handler: with the command's exit code known and its streams flushed, end the process
    here rather than after the interpreter's teardown. A stream that cannot be flushed leaves the exit to
    the interpreter, which reports it as it always has."""
    if not EXIT_CODE:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # the interpreter's own last flush decides what that means
        return
    os._exit(EXIT_CODE[0])


if __name__ == "__main__":
    main()
