"""An optional package that is missing is one line saying how to install it; Ctrl-C while it imports is an
interrupt, never a missing package (an interrupt in a dataclass's __set_name__ comes out of an import as a
RuntimeError, which a package may turn into an ImportError with no name)."""

import builtins
import sys

import pytest

from mlptrain.errors import UserError
from mlptrain.export.onnx_graph import require_onnx


def _importing(monkeypatch, error):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name in ("onnx", "onnxruntime"):
            raise error
        return real(name, *args, **kwargs)

    for name in ("onnx", "onnxruntime"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(builtins, "__import__", fake)


def _disguised_interrupt() -> ImportError:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("Error calling __set_name__") from interrupt
    except RuntimeError as wrapped:
        try:
            raise ImportError("onnx failed to initialise") from wrapped
        except ImportError as err:
            return err


def test_ctrl_c_during_the_import_is_an_interrupt(monkeypatch):
    _importing(monkeypatch, _disguised_interrupt())
    with pytest.raises(KeyboardInterrupt):
        require_onnx()


def test_a_missing_package_is_named(monkeypatch):
    _importing(monkeypatch, ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime"))
    with pytest.raises(UserError, match=r"\(onnxruntime is missing\); install them with"):
        require_onnx()


def test_an_import_that_fails_otherwise_never_says_none_is_missing(monkeypatch):
    _importing(monkeypatch, ImportError("DLL load failed"))
    with pytest.raises(UserError, match="installed but do not import \\(DLL load failed\\)") as caught:
        require_onnx()
    assert "None" not in str(caught.value)
