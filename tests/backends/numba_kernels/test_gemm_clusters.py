"""A split pass's chunks as one thread-block cluster (gemm_split.make_cluster_rows, sm_90+, the driver path):
the bits of the chunks' partials added by a launch of their own, and never a launch numba would make.

The simulator has no clusters (it runs a grid's blocks one after another), so it checks only that they are
never chosen or launched there; the real_gpu case runs them.
"""

import numpy as np
import pytest

from mlptrain.activation import RELU, SIGMOID
from mlptrain.backends.numba_kernels import current, gemm_engines, gemm_split
from tests import kernel_cases as cases
from tests.conftest import ON_SIMULATOR

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()


def count_clusters(monkeypatch):
    """A list that gets the (engine, backward) of each pass run as clusters."""
    calls, made = [], gemm_split.make_cluster_rows
    monkeypatch.setattr(gemm_split, "make_cluster_rows",
                        lambda tile, dtype, engine, staging, backward: calls.append((engine, backward)) or
                        made(tile, dtype, engine, staging, backward))
    return calls


@pytest.mark.skipif(not ON_SIMULATOR, reason="the simulator's refusal; the GPU runs the clusters below")
def test_the_simulator_never_runs_clusters(monkeypatch):
    """No pass is clustered there, and a cluster kernel refuses a numba launch (it would wait forever there)."""
    monkeypatch.setattr(gemm_split, "RUN_CLUSTERS", True)
    assert not gemm_split.clustered("mma16", 7)
    kernel = gemm_split.make_cluster_rows(gemm_engines.MMA16_TILE, np.dtype(np.uint16), "mma16", (True, True, 4),
                                          False)
    a = current.to_device(np.zeros((4, 4), np.uint16))
    with pytest.raises(RuntimeError, match="thread-block clusters, which only the driver path launches"):
        kernel[(1, 1, 2), 128, 0](a, a, current.to_device(np.zeros(4, np.uint16)), a, RELU, 2)


@pytest.mark.real_gpu
@pytest.mark.parametrize("shape", [(128, 784, 512), (100, 512, 512), (33, 1000, 300), (5, 136, 16)])
def test_clustered_passes_give_the_bits_of_their_chunks_added_by_a_launch(monkeypatch, shape):
    """Each engine's split forwards and input gradients, with clusters and without: the float64 references (the
    cases check them) and the same bits; the tensor-core engines' passes of at most CLUSTER_MOST chunks ran as
    clusters (more chunks, and the CUDA-core tiles, keep the second launch)."""
    calls = count_clusters(monkeypatch)
    for engine, dtype in (("mma16", np.uint16), ("mma16", np.float16), ("tf32x3", np.float32), ("fma", np.float32),
                          ("fma", np.uint16)):
        results = []
        for clusters in (False, True):
            monkeypatch.setattr(gemm_split, "RUN_CLUSTERS", clusters)
            forward = cases.linear_forward(BACKEND, np.random.default_rng(1), shape, SIGMOID, dtype, True, engine)
            backward = cases.linear_backward_input(BACKEND, np.random.default_rng(2), (shape[0], shape[2], shape[1]),
                                                   RELU, dtype, True, engine)
            results.append((forward, backward))
        for plain, clustered in zip(*results):
            np.testing.assert_array_equal(clustered.view(np.uint8), plain.view(np.uint8))
    if shape == (128, 784, 512):  # the benchmark's first layer: its passes split in 8 chunks or fewer
        assert {engine for engine, _ in calls} == {"mma16", "tf32x3"}
        assert {backward for _, backward in calls} == {False, True}
