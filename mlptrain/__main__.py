"""The `mlptrain` command's entry (`python -m mlptrain` and the installed script): its first steps, before it
imports anything else, then the CLI (mlptrain.cli). Importing this module runs nothing (tests/test_imports.py)."""

import sys


def main() -> None:
    # first, before the CLI's imports (0.1-0.2 s): a multi-GPU sweep forks its process per GPU, and the
    # commands that train start the CUDA driver meanwhile (mlptrain.sweep.prefork)
    from mlptrain.sweep.prefork import start_early

    waiting = start_early(sys.argv)
    # the CLI, imported once the driver starts: Typer, rich and the commands' modules
    from mlptrain.cli import main as command

    if waiting is None:
        command()
    else:  # a child forked above: it waits for the sweep command's call, runs it, and exits
        # imported here: only such a child runs it
        from mlptrain.cli.sweep import serve_planned

        serve_planned(waiting)


if __name__ == "__main__":
    main()
