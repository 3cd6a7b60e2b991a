"""The command's entry (mlptrain.__main__): it ends with os._exit only after Python's own exit steps that
matter, with the command's exit code and all its output."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _entry(command: str, tmp_path) -> subprocess.CompletedProcess:
    """mlptrain.__main__.main() with the CLI replaced by `command`'s body."""
    script = textwrap.dedent("""
        import atexit, sys, threading, time
        import mlptrain.cli
        from mlptrain import __main__ as entry

        def command():
    """) + textwrap.indent(textwrap.dedent(command), "    ") + textwrap.dedent("""
        mlptrain.cli.main = command
        sys.argv = ["mlptrain", "configs", "list"]
        entry.main()
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})


def test_the_command_ends_after_its_threads_its_handlers_and_its_output(tmp_path):
    done = _entry("""
        def late():  # a thread still working when the command returns: joined first, as Python does
            time.sleep(0.3)
            open("thread", "w").write("done")

        threading.Thread(target=late).start()
        atexit.register(lambda: open("handler", "w").write("ran"))
        sys.stdout.write("x" * 200000)  # buffered, not yet written
        sys.stderr.write("last words")
        sys.exit(3)
    """, tmp_path)
    assert done.returncode == 3
    assert done.stdout == "x" * 200000 and done.stderr == "last words"
    assert (tmp_path / "thread").read_text() == "done" and (tmp_path / "handler").read_text() == "ran"


def test_without_an_exit_code_the_interpreter_ends_as_it_always_has(tmp_path):
    """SystemExit with a message (not a code): Python prints it and exits 1."""
    done = _entry("""
        sys.exit("a message")
    """, tmp_path)
    assert done.returncode == 1 and done.stderr.strip() == "a message"
