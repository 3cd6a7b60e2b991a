"""The backend contract (mlptrain.backends.protocol): both backends offer every member of `Backend` with the
Protocol's parameters, and the two kernel sets are twins, family by family: the same public functions (the
launchers) with the same signatures. Kernels and kernel factories (`*_kernel`, `make_*`) are the CUDA side's
own, as are its launch constants; the twin modules may each keep helpers under other module names
(numba_kernels/tiles.py, numpy_kernels/im2col.py, ...)."""

import importlib
import inspect

import pytest

from mlptrain.backends import protocol
from mlptrain.backends.cpu import CpuBackend
from mlptrain.backends.cuda import CudaBackend

MEMBERS = [name for name in dir(protocol.Backend) if not name.startswith("_")]
METHODS = [name for name in MEMBERS if inspect.isfunction(getattr(protocol.Backend, name))]
ATTRIBUTES = sorted(protocol.Backend.__annotations__)


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_protocol_names_what_the_loop_uses():
    assert {"empty", "zeros", "to_device", "to_host", "copy_from_host", "synchronize", "capture"} <= set(METHODS)
    assert ATTRIBUTES == ["copies_lane_views", "device_name", "fallbacks", "kernels", "name"]


@pytest.mark.parametrize("backend", [CpuBackend, CudaBackend], ids=["cpu", "cuda"])
def test_each_backend_has_every_method_with_the_protocols_parameters(backend):
    for name in METHODS:
        assert callable(getattr(backend, name, None)), f"{backend.__name__} has no {name}"
        assert parameters(getattr(backend, name)) == parameters(getattr(protocol.Backend, name)), name


def test_the_cpu_backend_is_a_backend():
    backend = CpuBackend()
    assert isinstance(backend, protocol.Backend)
    for family in protocol.FAMILIES:
        assert inspect.ismodule(getattr(backend.kernels, family))


def launchers(module) -> dict[str, inspect.Signature]:
    """A kernel module's public functions defined in it, kernels and kernel factories left out."""
    out = {}
    for name, value in vars(module).items():
        function = inspect.unwrap(value) if callable(value) else None
        if name.startswith("_") or not inspect.isfunction(function) or function.__module__ != module.__name__:
            continue
        if name.endswith("_kernel") or name.startswith("make_"):
            continue
        out[name] = inspect.signature(function)
    return out


def test_the_launcher_finder_sees_what_it_must():
    """The check below can fail: a module's own functions are found, imported ones and kernels are not."""
    gemm = importlib.import_module("mlptrain.backends.numpy_kernels.gemm")
    found = launchers(gemm)
    assert {"linear_forward", "linear_backward_input", "linear_backward_weight"} <= set(found)
    assert not {"NONE", "RELU"} & set(found)


@pytest.mark.parametrize("family", protocol.FAMILIES)
def test_the_kernel_sets_are_twins(family):
    cpu = launchers(importlib.import_module(f"mlptrain.backends.numpy_kernels.{family}"))
    gpu = launchers(importlib.import_module(f"mlptrain.backends.numba_kernels.{family}"))
    assert sorted(cpu) == sorted(gpu), f"only on the CPU: {sorted(set(cpu) - set(gpu))}; " \
                                       f"only on the GPU: {sorted(set(gpu) - set(cpu))}"
    differ = {name: (str(cpu[name]), str(gpu[name])) for name in cpu if cpu[name] != gpu[name]}
    assert differ == {}
