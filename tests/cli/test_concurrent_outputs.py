"""Outputs outside a run folder are never replaced without --force, also when another command writes the same
new file while this one works (issue 36: two `export --out x` at once both exited 0, the second replacing the
first). The other command is played by a file made at the output's name once the command has checked it."""

import numpy as np
import pytest

from mlptrain.errors import UserError
from tests.cli.test_inference_cli import invoke


@pytest.mark.parametrize("command", ["export", "predict", "evaluate", "extract-features", "svm", "configs"])
def test_a_file_made_meanwhile_at_the_output_is_kept(tiny_runs, tmp_path, monkeypatch, command):
    import mlptrain.cli.configs as configs_cli
    import mlptrain.cli.options as options

    out = tmp_path / "out.file"
    images, features = tmp_path / "images.npz", tmp_path / "f.npz"
    np.savez(images, images=np.zeros((2, 28, 28), np.uint8))
    x, y = np.eye(4, dtype=np.float32), np.arange(4) % 2
    np.savez(features, train_x=x, train_y=y, test_x=x, test_y=y)
    args = {"export": ["export", tiny_runs["mlp"], "--format", "safetensors"],
            "predict": ["predict", tiny_runs["mlp"], images], "evaluate": ["evaluate", tiny_runs["mlp"]],
            "extract-features": ["extract-features", tiny_runs["mlp"]], "svm": ["svm", features]}.get(command)

    def checked_then_taken(path, *rest, **kwargs):
        """The check passes, then the other command writes the file (a real race's window, made certain)."""
        path = real_new_output(path, *rest, **kwargs)
        out.write_bytes(b"the other command's")
        return path

    if command == "configs":  # checked by write_new itself: the other command writes between check and write
        real_write_text = configs_cli.write_text
        monkeypatch.setattr(configs_cli, "write_text", lambda *a, **k: out.write_bytes(b"the other command's")
                            and real_write_text(*a, **k))
        args = ["configs", "copy", "adam_mnist", out]
    else:
        real_new_output = options.new_output
        module = __import__(f"mlptrain.cli.{command.replace('extract-', '')}", fromlist=["new_output"])
        monkeypatch.setattr(module, "new_output", checked_then_taken)
        args = [*args, "--out", out]
    with pytest.raises(UserError, match=f"{out} exists \\(another process made it while this one worked\\); add "
                                        "--force to overwrite it"):
        invoke(*args)
    assert out.read_bytes() == b"the other command's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.npz", "images.npz", "out.file"]  # no temporary left
