"""The tensor-core convolutions (conv_mma, gemm_mma, tensor_core) against float64 references.

On the simulator a 256-thread block of the production tile takes ~20 s (each
mma trades its fragments through shared memory), so these cases run on
MINI_TILE, four warps on a 32 x 16 tile; shapes leave every edge ragged:
pixels past a block's 32 rows, channels past its 16 columns, K past its
32-deep slices, odd pixel counts in the weight gradient's chunks. The
production tile runs in the `real_gpu` cases here and in test_conv's
autoencoder layers.
"""

import numpy as np
import pytest
from numba import cuda

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.kernel_cache import numba_names
from mlptrain.backends.numba_kernels import chunks, conv, conv_mma, conv_padded, conv_plan, gemm_mma, tensor_core
from tests import kernel_cases
from tests import reference_conv as ref
from tests.backends.numba_kernels.test_conv import MINI_TILE, twice

pytestmark = pytest.mark.gpu

BACKEND = kernel_cases.numba_backend()
FP32, FP16, BF16 = np.float32, np.float16, np.uint16


@pytest.fixture
def mini_tile(monkeypatch):
    monkeypatch.setattr(conv_mma, "TILE", MINI_TILE)


def _bits(values, dtype):
    """The 16-bit storage of float32 values, as uint32 pairs of (even, odd) columns."""
    halves = ref.from_float32(values, dtype).view(np.uint16).astype(np.uint32)
    return halves[..., 0::2] | (halves[..., 1::2] << 16)


def one_warp(kind, regs, c):
    """D = A @ B + C (16 x 8) of one warp's tensor_core.mma(kind), its lanes holding `regs` (32 lanes x a0-a3,
    b0, b1) and C laid out as tensor_core's docstring says."""
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    accs = np.stack([c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]], axis=1)
    product = numba_names.resolve(tensor_core.mma(kind))  # numba's own intrinsic, for numba's own kernel

    @cuda.jit
    def kernel(regs, accs):
        i = cuda.threadIdx.x
        accs[i, 0], accs[i, 1], accs[i, 2], accs[i, 3] = product(
            regs[i, 0], regs[i, 1], regs[i, 2], regs[i, 3], regs[i, 4], regs[i, 5],
            accs[i, 0], accs[i, 1], accs[i, 2], accs[i, 3])

    out = cuda.to_device(accs)
    kernel[1, 32](cuda.to_device(np.ascontiguousarray(regs, np.uint32)), out)
    got = np.zeros((16, 8))
    got[g, 2 * t], got[g, 2 * t + 1], got[g + 8, 2 * t], got[g + 8, 2 * t + 1] = out.copy_to_host().T
    return got


@pytest.mark.parametrize("kind, dtype", [("bf16", BF16), ("fp16", FP16)])
def test_mma_matches_the_fragment_layout(rng, kind, dtype):
    """One warp's m16n8k16 product, its fragments laid out as tensor_core's docstring says."""
    a, b = ref.stored(rng, (16, 16), dtype), ref.stored(rng, (16, 8), dtype)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    pairs_a, pairs_b = _bits(a[1].astype(np.float32), dtype), _bits(b[1].T.astype(np.float32), dtype)
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    regs = np.stack([pairs_a[g, t], pairs_a[g + 8, t], pairs_a[g, t + 4], pairs_a[g + 8, t + 4],
                     pairs_b[g, t], pairs_b[g, t + 4]], axis=1)
    got = one_warp(kind, regs, c)
    expected = a[1] @ b[1] + c
    bound = ref.gamma(17, 2 * ref.U32) * (np.abs(a[1]) @ np.abs(b[1]) + np.abs(c))
    ref.assert_within(got, expected, bound)


def test_tf32_mma_matches_the_fragment_layout(rng):
    """One warp's m16n8k8 product on tf32 values (float32 with its low 13 bits zero), its fragments laid out
    as tensor_core's docstring says."""
    a, b = (((rng.standard_normal(shape).astype(np.float32).view(np.uint32) & np.uint32(tensor_core.TF32_MASK))
             .view(np.float32)) for shape in ((16, 8), (8, 8)))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    bits_a, bits_b = a.view(np.uint32), b.view(np.uint32)
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    regs = np.stack([bits_a[g, t], bits_a[g + 8, t], bits_a[g, t + 4], bits_a[g + 8, t + 4],
                     bits_b[t, g], bits_b[t + 4, g]], axis=1)
    got = one_warp("tf32", regs, c)
    ref.assert_within(got, a.astype(np.float64) @ b + c, 1e-5 * (np.abs(a) @ np.abs(b) + np.abs(c)) + 1e-6)


def test_mma_rejects_other_formats():
    with pytest.raises(ValueError, match="no tensor-core product for 'fp32'"):
        tensor_core.mma("fp32")


@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 5, 7, 6, 20), 3, RELU, BF16),  # 35 pixels, 20 channels, K = 54: two blocks each way, two slices
    ((2, 3, 4, 8, 9), 1, TANH, FP16),
    ((1, 4, 5, 2, 17), 5, SIGMOID, BF16),  # Cin = 2 with a 5 x 5 kernel: past conv_wide
    ((1, 6, 3, 12, 16), 3, NONE, FP16),
])
def test_forward(rng, mini_tile, shape, size, activation, dtype):
    ref.forward_case(BACKEND, rng, shape, size, activation, dtype)


@pytest.mark.parametrize("shape, size, activation, dtype", [
    ((1, 5, 7, 20, 6), 3, RELU, BF16),
    ((2, 3, 4, 9, 8), 1, TANH, FP16),
    ((1, 4, 5, 17, 10), 3, SIGMOID, FP16),
])
def test_backward_input(rng, mini_tile, shape, size, activation, dtype):
    """Given the buffer for the flipped kernel, an even Cout runs on tensor cores."""
    ref.backward_input_case(BACKEND, rng, shape, size, activation, dtype, flipped=True)


@pytest.mark.parametrize("shape, size, beta, dtype", [
    ((1, 5, 7, 3, 20), 3, 0.0, BF16),  # rows 27, 20 channels: two blocks each way; 35 pixels
    ((2, 3, 3, 5, 9), 1, 1.0, FP16),
    ((1, 5, 5, 7, 6), 3, 1.0, FP16),
])
def test_backward_weight(rng, mini_tile, shape, size, beta, dtype):
    ref.backward_weight_case(BACKEND, rng, shape, size, beta, dtype)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_backward_weight_in_several_chunks(rng, mini_tile, monkeypatch, beta):
    """105 pixels in chunks of 64: the second ragged, ending on an odd pixel."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 32)
    monkeypatch.setattr(chunks, "CHUNK_BLOCKS", 10**6)
    assert conv_mma.weight_plan((3, 5, 7, 2), (3, 3, 2, 5)) == (64, 2, 3)
    ref.backward_weight_case(BACKEND, rng, (3, 5, 7, 2, 5), 3, beta, BF16)


def test_results_are_bitwise_reproducible(rng, mini_tile, monkeypatch):
    """Each output is one warp's mma sequence and the chunks add in order: two launches, same bits."""
    monkeypatch.setattr(chunks, "MIN_CHUNK", 8)
    monkeypatch.setattr(chunks, "CHUNK_STEP", 8)
    (x, _), (w, _), (b, _) = (ref.stored(rng, s, BF16) for s in ((1, 5, 7, 6), (3, 3, 6, 18), (18,)))
    dy = ref.stored(rng, (1, 5, 7, 18), BF16)[0]
    x, w, b, dy = (cuda.to_device(a) for a in (x, w, b, dy))
    y = ref.poisoned(BACKEND, (1, 5, 7, 18), BF16)
    dw = ref.poisoned(BACKEND, (3, 3, 6, 18), np.float32)
    workspace = ref.poisoned(BACKEND, conv.conv2d_backward_weight_workspace(x.shape, w.shape, x.dtype), np.float32)
    assert conv_mma.weight_plan(x.shape, w.shape)[1] == 3
    twice(lambda: conv.conv2d_forward(x, w, b, y, RELU), y)
    twice(lambda: conv.conv2d_backward_weight(x, dy, dw, 0.0, workspace), dw)


def test_tensor_cores_take_16_bit_passes_that_pair_up(monkeypatch):
    """16-bit storage with an even number of summed channels; the input gradient only given the
    flipped-kernel buffer; the weight gradient whatever its channels; never float32."""
    calls = []
    for name in ("forward", "backward_input", "weight_partials"):
        monkeypatch.setattr(conv_mma, name, lambda *args, name=name: calls.append(name))
    monkeypatch.setattr(chunks, "add_chunks", lambda *args: None)
    monkeypatch.setattr(conv_padded, "add_chunks", lambda *args: None)  # x7's weight gradient: Cin padded to 8
    for dtype in (FP32, BF16, FP16):
        device = lambda *shape: cuda.to_device(np.zeros(shape, dtype))  # noqa: E731
        x6, x7, y8 = device(1, 2, 3, 6), device(1, 2, 3, 7), device(1, 2, 3, 8)
        conv.conv2d_forward(x6, device(3, 3, 6, 8), device(8), y8, RELU)
        conv.conv2d_forward(x7, device(3, 3, 7, 8), device(8), y8, RELU)
        conv.conv2d_backward_input(y8, device(3, 3, 7, 8), x7, x7, RELU, device(9 * 7 * 8))
        conv.conv2d_backward_input(y8, device(3, 3, 7, 8), x7, x7, RELU)
        workspace = cuda.to_device(np.zeros(conv.conv2d_backward_weight_workspace(x7.shape, (3, 3, 7, 8), dtype), FP32))
        conv.conv2d_backward_weight(x7, y8, cuda.to_device(np.zeros((3, 3, 7, 8), FP32)), 0.0, workspace)
        expected = [] if dtype == FP32 else ["forward", "backward_input", "weight_partials"]
        assert calls == expected, dtype
        calls.clear()


def test_gpus_without_tensor_cores_keep_the_cuda_core_tiles():
    old, new = (7, 5), (8, 0)
    assert not conv_plan.tensor_cores(BF16, 2, old) and not conv_plan.tensor_cores(FP16, 0, old)
    assert conv_plan.tensor_cores(BF16, 2, new) and conv_plan.tensor_cores(FP16, 0, new)
    assert not conv_plan.tensor_cores(BF16, 3, new) and not conv_plan.tensor_cores(FP32, 2, new)


def test_tiles_must_cover_fragments():
    assert gemm_mma.threads(conv_mma.TILE) == 256 and gemm_mma.threads(MINI_TILE) == 128
    with pytest.raises(ValueError, match="16 x 8 fragments"):
        gemm_mma.threads((24, 16, 1, 1))


@pytest.mark.real_gpu
@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_production_tile_on_awkward_shapes(rng, dtype):
    """The production tile, several blocks each way with ragged edges, every pass."""
    ref.forward_case(BACKEND, rng, (3, 9, 11, 34, 150), 3, RELU, dtype)
    ref.backward_input_case(BACKEND, rng, (3, 9, 11, 150, 34), 3, TANH, dtype, flipped=True)
    ref.backward_weight_case(BACKEND, rng, (3, 9, 11, 34, 150), 3, 1.0, dtype)
