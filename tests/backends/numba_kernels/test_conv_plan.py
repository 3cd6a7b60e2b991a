"""conv_plan.plan: the variant each pass of each autoencoder layer takes, and the workspace it sizes."""

import numpy as np
import pytest

from mlptrain.backends.numba_kernels import conv_narrow, conv_plan

FP32, BF16, FP16 = np.dtype(np.float32), np.dtype(np.uint16), np.dtype(np.float16)
H100, V100 = (9, 0), (7, 0)
# the default autoencoder at batch 64: (x shape, w shape) of conv1 ... conv5
LAYERS = [((64, 32, 32, 3), (3, 3, 3, 256)), ((64, 16, 16, 256), (3, 3, 256, 128)),
          ((64, 8, 8, 128), (3, 3, 128, 128)), ((64, 16, 16, 128), (3, 3, 128, 256)),
          ((64, 32, 32, 256), (3, 3, 256, 3))]


def labels(dtype, capability):
    return [[conv_plan.plan(p, x, w, dtype, capability).label() for p in conv_plan.PASSES] for x, w in LAYERS]


def test_fp32_on_an_h100():
    assert labels(FP32, H100) == [
        ["wide", "tiled/narrow", "tiled/small"],  # RGB in: direct forward; the input gradient is not needed
        ["tiled/wide", "tiled/wide", "tiled/square"],
        ["tiled/medium", "tiled/medium", "tiled/square"],  # 8 x 8 x 64 pixels: too few blocks for wide
        ["tiled/wide", "tiled/wide", "tiled/square"],
        ["narrow", "wide", "narrow"],  # RGB out: direct forward and weight gradient, wide input gradient
    ]


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_16_bit_takes_tensor_cores_where_channels_pair_up(dtype):
    assert labels(dtype, H100) == [
        ["wide", "tensor_cores", "tensor_cores/cin_padded"],  # the 3 RGB channels padded to 8 (conv_padded)
        ["tensor_cores"] * 3,
        ["tensor_cores"] * 3,
        ["tensor_cores"] * 3,
        ["tensor_cores/cout_padded", "wide", "narrow"],
    ]
    odd = conv_plan.plan("forward", (2, 8, 8, 7), (3, 3, 7, 16), dtype, H100)
    assert odd.variant == "tiled"  # 7 summed channels do not pair up


def test_older_gpus_and_unflipped_kernels_keep_the_cuda_core_tiles():
    assert labels(BF16, V100)[1] == ["tiled/wide", "tiled/wide", "tiled/square"]
    x, w = LAYERS[1]
    assert conv_plan.plan("backward_input", x, w, BF16, H100, flipped=False).label() == "tiled/wide"


def test_workspace_is_the_chosen_variants_and_never_shrinks():
    for x, w in LAYERS:
        for dtype in (FP32, BF16):
            sizes = [conv_plan.plan("backward_weight", (n, *x[1:]), w, dtype, H100).workspace for n in range(1, 65)]
            assert sizes == sorted(sizes) and sizes[-1] >= np.prod(w)
            assert all(conv_plan.plan(p, x, w, dtype, H100).workspace == 0 for p in PASSES_WITHOUT_WORKSPACE)
    x, w = LAYERS[4]
    assert conv_plan.plan("backward_weight", x, w, FP32, H100).workspace == conv_narrow.weight_workspace(x, w)


PASSES_WITHOUT_WORKSPACE = ("forward", "backward_input")


def test_an_unknown_pass_is_refused():
    with pytest.raises(ValueError, match="unknown convolution pass 'sideways'"):
        conv_plan.plan("sideways", *LAYERS[0], FP32, H100)
