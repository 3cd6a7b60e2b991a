"""Storage formats: bfloat16 rounding and decoding in `mlptrain.dtypes` (against a float64
reference written here), the CUDA `precision.cast` kernel bit for bit against them, and mixed
precision training on the CPU backend."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.dtypes import (
    STORAGE,
    bf16_from_float32,
    float32_from_bf16,
    from_float32,
    precision_of,
    round_to_storage,
    to_float32,
)
from mlptrain.training.loop import train_epoch
from mlptrain.training.session import build_session
from tests.training.test_accumulation import make_config, synthetic_dataset

ALL_BF16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
BF16_NAN = ((ALL_BF16 & 0x7F80) == 0x7F80) & ((ALL_BF16 & 0x007F) != 0)


def float32_of_bits(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def reference_bf16(values):
    """bfloat16 bit patterns of finite float32 values, rounded to nearest with ties to even, decided
    by comparing distances in float64; beyond the largest bfloat16 the candidate above is 2^128
    (IEEE 754 overflow: to inf from halfway between the largest finite value and 2^128)."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    sign, magnitude = bits & 0x80000000, bits & 0x7FFFFFFF
    below = magnitude >> 16  # truncated toward zero: the candidate at or below
    low = float32_of_bits(below << 16).astype(np.float64)
    high = np.where(below + 1 == 0x7F80, 2.0**128, float32_of_bits((below + 1) << 16).astype(np.float64))
    x = float32_of_bits(magnitude).astype(np.float64)
    up = (high - x < x - low) | ((high - x == x - low) & (below % 2 == 1))
    return ((sign >> 16) | (below + up)).astype(np.uint16)


def bf16(*float32_bits):
    return bf16_from_float32(float32_of_bits(np.array(float32_bits, np.uint32)))


# decoding


def test_decoding_is_exact_for_every_bit_pattern():
    decoded = float32_from_bf16(ALL_BF16)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded.view(np.uint32), ALL_BF16.astype(np.uint32) << 16)


def test_every_representable_value_is_unchanged():
    """Every bfloat16 value (zeros, subnormals, the largest finite, the infinities) round-trips exactly."""
    finite_or_inf = ALL_BF16[~BF16_NAN]
    np.testing.assert_array_equal(bf16_from_float32(float32_from_bf16(finite_or_inf)), finite_or_inf)
    assert bf16_from_float32(np.float32([0.0, -0.0, 1.0, -2.5, 0.15625, 3.0e38])).tolist()[:5] == \
        [0x0000, 0x8000, 0x3F80, 0xC020, 0x3E20]


# rounding


@pytest.mark.parametrize("bits, expected", [
    (0x3F808000, 0x3F80),  # 1 + 2^-8: halfway between 1 (even) and 1 + 2^-7: down
    (0x3F818000, 0x3F82),  # halfway between 0x3F81 (odd) and 0x3F82 (even): up
    (0xBF808000, 0xBF80),  # the same for negative values
    (0xBF818000, 0xBF82),
    (0x3F808001, 0x3F81),  # one float32 ulp above the tie: up
    (0x3F807FFF, 0x3F80),  # one below: down
    (0x3FFF8000, 0x4000),  # a tie that carries into the exponent: 1.9921875 + 2^-8 -> 2
    (0x00008000, 0x0000),  # subnormal tie between 0 (even) and the smallest subnormal
    (0x00018000, 0x0002),
    (0x80008000, 0x8000),  # -tiny rounds to -0
])
def test_ties_round_to_even(bits, expected):
    assert bf16(bits)[0] == expected


@pytest.mark.parametrize("bits", [0x7FC00000, 0x7F800001, 0x7F80FFFF, 0x7FFFFFFF, 0xFFC00000, 0xFF800001,
                                  0xFFFFFFFF, 0x7FBFFFFF])
def test_nan_stays_nan(bits):
    """Rounding the bit pattern would turn 0x7F800001 into inf and 0xFFFFFFFF into a carry out of 16 bits."""
    out = bf16(bits)
    decoded = float32_from_bf16(out)[0]
    assert np.isnan(decoded)
    assert np.signbit(decoded) == bool(bits >> 31)


def test_infinities_stay_infinite():
    assert bf16_from_float32(np.float32([np.inf, -np.inf])).tolist() == [0x7F80, 0xFF80]


@pytest.mark.parametrize("bits, expected", [
    (0x7F7FFFFF, 0x7F80),  # the largest float32: above the largest bfloat16 by more than half an ulp
    (0x7F7F8000, 0x7F80),  # exactly halfway between the largest bfloat16 (odd) and 2^128: to inf
    (0xFF7FFFFF, 0xFF80),
    (0x7F7F7FFF, 0x7F7F),  # just below halfway: the largest finite bfloat16
    (0x7F7F0000, 0x7F7F),
])
def test_overflow_to_inf(bits, expected):
    assert bf16(bits)[0] == expected


def test_rounding_matches_the_float64_reference_on_random_values(rng):
    patterns = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    values = float32_of_bits(patterns)
    values = values[np.isfinite(values)]
    scaled = (rng.standard_normal(50_000) * 10.0 ** rng.integers(-40, 39, 50_000)).astype(np.float32)
    for x in (values, scaled[np.isfinite(scaled)]):
        np.testing.assert_array_equal(bf16_from_float32(x), reference_bf16(x))


def test_rounding_error_is_at_most_half_an_ulp(rng):
    """8 significant bits: the unit roundoff is 2^-8."""
    x = rng.standard_normal(10_000).astype(np.float32)
    error = np.abs(float32_from_bf16(bf16_from_float32(x)).astype(np.float64) - x)
    assert (error <= 2.0**-8 * np.abs(x)).all() and error.max() > 2.0**-10 * np.abs(x[error.argmax()])


# the storage helpers


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 65520 -> inf in fp16
def test_storage_formats():
    assert {name: precision_of(dtype) for name, dtype in STORAGE.items()} == {"fp32": "fp32", "fp16": "fp16",
                                                                            "bf16": "bf16"}
    with pytest.raises(ValueError, match="float64"):
        precision_of(np.float64)
    x = np.float32([1.0, 1.0 + 2.0**-9, 65520.0, 1e-8])
    np.testing.assert_array_equal(round_to_storage(x, np.float32), x)
    np.testing.assert_array_equal(from_float32(x, np.float16), x.astype(np.float16))
    np.testing.assert_array_equal(round_to_storage(x, np.uint16), float32_from_bf16(bf16_from_float32(x)))
    np.testing.assert_array_equal(to_float32(from_float32(x, np.float16)), x.astype(np.float16).astype(np.float32))
    assert to_float32(x) is x


# the CUDA cast kernel, bit for bit


def tricky_float32():
    special = np.array([
        0x00000000, 0x80000000, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x3FFF8000,
        0x00008000, 0x00018000, 0x00000001, 0x007FFFFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF,
        0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0xFF800001,
    ], np.uint32)
    fp16 = np.float32([
        65504.0, 65519.996, 65520.0, -65520.0, 1e6, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 3 * 2.0**-25, 2.0**-26,
        1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-20, 6.1035156e-05, 6.097555e-05, 2049.0, 2051.0,
        -0.1, 0.1, 1.0 / 3.0,
    ])
    random = np.random.default_rng(5).integers(0, 1 << 32, 200, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([float32_of_bits(special), fp16, float32_of_bits(random)])


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float16, np.uint16], ids=["fp16", "bf16"])
def test_cuda_cast_matches_numpy_bit_for_bit(dtype):
    from numba import cuda

    from mlptrain.backends.numba_kernels import precision

    x = tricky_float32()
    out = cuda.to_device(np.full(x.shape, 0x5555, np.uint16).view(dtype))
    precision.cast(cuda.to_device(x), out)
    got, expected = out.copy_to_host(), from_float32(x, dtype)
    if dtype == np.float16:  # a GPU may write any NaN for a NaN: compare NaNs as NaNs, the rest bit for bit
        nan = np.isnan(expected)
        assert np.isnan(got[nan]).all()
        got, expected = got[~nan], expected[~nan]
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


@pytest.mark.gpu
def test_cuda_cast_launcher_checks():
    from numba import cuda

    from mlptrain.backends.numba_kernels import precision

    src = cuda.to_device(np.zeros(4, np.float32))
    with pytest.raises(ValueError):
        precision.cast(cuda.to_device(np.zeros(4)), cuda.to_device(np.zeros(4, np.float16)))
    with pytest.raises(ValueError):
        precision.cast(src, cuda.to_device(np.zeros(5, np.uint16)))
    precision.cast(cuda.to_device(np.zeros(0, np.float32)), cuda.to_device(np.zeros(0, np.uint16)))


# mixed precision training on the CPU backend


def train_run(precision, epochs=3):
    config = make_config(64, 2, optim={"name": "adamw", "lr": 0.01, "weight_decay": 0.01}, precision=precision)
    session = build_session(config, CpuBackend(), synthetic_dataset())
    before = session.evaluator.evaluate(session.val)[0]
    reads = []
    for epoch in range(1, epochs + 1):
        train_epoch(session, epoch, reads.append)
    return session, before, session.evaluator.evaluate(session.val)[0], reads


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_training_decreases_the_loss(precision):
    session, before, after, reads = train_run(precision)
    storage = STORAGE[precision]
    assert session.model.compute.flat.dtype == storage and session.model.h[1].dtype == storage
    assert session.model.params.flat.dtype == np.float32 and session.model.grads.flat.dtype == np.float32
    np.testing.assert_array_equal(session.model.compute.flat, from_float32(session.model.params.flat, storage))
    assert np.isfinite(after) and after < 0.8 * before
    assert reads[-1]["loss"] < 0.8 * reads[0]["loss"]
    state = session.step.read()
    assert state["steps"] == 3 * session.steps_per_epoch - state["skipped"]
    if precision == "bf16":
        assert state["loss_scale"] == 1.0 and state["skipped"] == 0
    _, _, fp32_after, _ = train_run("fp32")
    assert after == pytest.approx(fp32_after, rel=0.05)  # mixed precision tracks fp32 on this small problem
