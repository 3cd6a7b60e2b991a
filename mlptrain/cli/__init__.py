"""The `mlptrain` command: a thin Typer app over plain functions.

Every `UserError` raised below becomes one red line on stderr and exit code 2 (or its own
`exit_code`: 130 for a run interrupted by Ctrl-C). Bare `mlptrain` prints the help and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

# first, so that they cover the imports below (numba, optuna and rich take a noticeable fraction of a second)
from mlptrain.cli import output, signals  # both import only the standard library (and mlptrain.errors)

signals.catch_interrupts_from_start()
output.guard_output()

import typer  # noqa: E402

from mlptrain import __version__  # noqa: E402
from mlptrain.cli import cache, compare, configs, evaluate, export, features, predict, run, svm, sweep, warmup  # noqa: E402
from mlptrain.errors import OutputClosed, UserError  # noqa: E402

MAX_MESSAGE = 2000  # a message echoes values cut short already; this bounds whatever slipped through

app = typer.Typer(pretty_exceptions_enable=False,
                  help="Train small neural networks: on NVIDIA GPUs with hand-written Numba CUDA kernels, or on "
                       "any machine with the NumPy backend (backend: cpu).")


def _no_type_for_flags() -> None:
    """Typer 0.29's help shows `<bool>` beside every flag (--force, --help), which reads as a value to give.
    A flag takes none: its type column is left empty. (Older Typer shows none and has no such method.)"""
    shown = getattr(typer.core.TyperOption, "display_type_rich", None)
    if shown is None:
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    typer.core.TyperOption.display_type_rich = display_type_rich


_no_type_for_flags()
app.command("run")(run.run)
app.command("sweep")(sweep.sweep)
app.command("evaluate")(evaluate.evaluate)
app.command("predict")(predict.predict)
app.command("export")(export.export)
app.command("extract-features")(features.extract_features)
app.command("svm")(svm.svm)
app.command("warmup")(warmup.warmup)
app.command("compare")(compare.compare)
app.add_typer(configs.app, name="configs")
app.add_typer(cache.app, name="cache")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlptrain {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context,
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    # bare `mlptrain` is a request for help, not a mistake: print it and exit 0
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit()


INTERRUPTED = tuple(128 + sig for sig in signals.SIGNALS)


def main() -> None:
    try:
        _main()
        code = 0
    except SystemExit as done:
        code = done.code
    except OutputClosed as closed:  # while reporting another outcome (a terminal gone after SIGHUP)
        code = closed.exit_code
    finally:
        # The outcome is decided and reported; a Ctrl-C from here on could only land in the interpreter's
        # shutdown, after Python has put back the default handler, and kill it with no message (exit -2).
        if threading.current_thread() is threading.main_thread():
            for sig in signals.SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
    if code in INTERRUPTED:
        # CPython ends a process with SIGINT (exit -2, no message) once a KeyboardInterrupt has escaped code
        # that exec() ran from a string, even one caught afterwards: dataclasses and namedtuple build their
        # methods so at import, so a Ctrl-C during start-up hits it. The interrupted process reports its code.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


# Click's own errors (a missing or unknown option or argument, a bad choice), whichever Click Typer uses
CLICK_ERROR = next(kind for kind in typer.BadParameter.__mro__ if kind.__name__ == "ClickException")


def _main() -> None:
    # here, not at the top: rich's console is not imported before a command runs (see _print_error)
    from mlptrain.util.console import show_warnings_as_lines

    show_warnings_as_lines()
    try:
        # not standalone: Click's usage errors come here to be printed in one line like every other error,
        # rather than as Typer's usage block and boxed message
        code = app(prog_name="mlptrain", standalone_mode=False)
    except CLICK_ERROR as err:
        where = getattr(getattr(err, "ctx", None), "command_path", None) or "mlptrain"
        text = f"{where}: {err.format_message()} (`{where} --help` lists what it takes)"
        _print_error("error:", " ".join(text.split()))
        sys.exit(err.exit_code)
    except typer.Abort:
        _say_interrupted()
        sys.exit(1)
    except UserError as err:
        code = getattr(err, "exit_code", 2)
        text = str(err) if getattr(err, "multiline", False) else " ".join(str(err).split("\n"))
        text = text if len(text) <= MAX_MESSAGE else f"{text[:MAX_MESSAGE]}..."
        _print_error("error:" if code == 2 else "stopped:", text)
        sys.exit(code)
    except OutputClosed as closed:  # nothing can be said: the exit code is all
        sys.exit(closed.exit_code)
    except (MemoryError, RuntimeError) as err:
        # here, not at the top: --help and the light commands start without it (as _print_error's imports)
        from mlptrain.util.host_memory import is_out_of_memory, out_of_memory

        if not is_out_of_memory(err):
            raise
        _print_error("error:", out_of_memory(err))
        sys.exit(2)
    except KeyboardInterrupt as err:  # before a command has its own handling (start-up, loading data)
        _say_interrupted()
        sys.exit(128 + getattr(err, "signum", 2))
    # Typer turns a KeyboardInterrupt it catches (Ctrl-C while it parses the arguments) into typer.Exit(130),
    # which, not standalone, comes back as this return code rather than a SystemExit
    if code == 128 + signal.SIGINT:
        _say_interrupted()
        code = 128 + (signals.was_terminated() or signal.SIGINT)
    if isinstance(code, int) and code:
        sys.exit(code)


def _print_error(label: str, text: str) -> None:
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from rich.markup import escape

    from mlptrain.util.console import console

    # escaped: a value from the user's input may look like rich markup ("[/]")
    console.print(f"[bold red]{label}[/] {escape(text)}", highlight=False, soft_wrap=True)


def _say_interrupted() -> None:
    sys.stderr.write("interrupted\n")
    sys.stderr.flush()
