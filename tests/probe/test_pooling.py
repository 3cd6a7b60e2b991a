"""Grid pooling of the latent (extract-features --pool): against a float64 reference loop written here,
the region edges on sides the grid does not divide, the refusals, and the pooled file of a real run."""

import numpy as np
import pytest

from mlptrain.errors import UserError
from mlptrain.probe.features import extract_features, load_features, save_features
from mlptrain.probe.pooling import GridPool, check_grid, grid_pool
from tests.cli.test_cli import assert_clean_failure, mlptrain


def reference(x, grid, mode):
    """Each of the G x G regions' average or maximum per channel, region by region, in float64."""
    n, h, w, c = x.shape
    out = np.zeros((n, grid, grid, c))
    for i in range(grid):
        for j in range(grid):
            rows = slice(int(np.floor(i * h / grid)), int(np.floor((i + 1) * h / grid)))
            cols = slice(int(np.floor(j * w / grid)), int(np.floor((j + 1) * w / grid)))
            region = x[:, rows, cols, :].astype(np.float64)
            out[:, i, j] = region.mean(axis=(1, 2)) if mode == "avg" else region.max(axis=(1, 2))
    return out.reshape(n, -1)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("shape, grid", [((3, 8, 8, 5), 2), ((2, 8, 8, 4), 4), ((2, 7, 5, 3), 3), ((1, 6, 6, 2), 1),
                                         ((2, 4, 4, 3), 4)])
def test_pool_matches_the_reference(rng, mode, shape, grid):
    x = rng.standard_normal(shape).astype(np.float32)
    out = GridPool(mode, grid)(x)
    assert out.shape == (shape[0], grid * grid * shape[3]) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(x, grid, mode), rtol=1e-6, atol=1e-7)


def test_quadrants_by_hand():
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)  # rows 0..3: 0-3, 4-7, 8-11, 12-15
    np.testing.assert_array_equal(GridPool("max", 2)(x), [[5, 7, 13, 15]])
    np.testing.assert_array_equal(GridPool("avg", 2)(x), [[2.5, 4.5, 10.5, 12.5]])
    np.testing.assert_array_equal(GridPool("avg", 1)(x), [[7.5]])
    assert GridPool("avg", 2).width((8, 8, 128)) == 512 and GridPool("max", 3).describe() == "max 3x3"


@pytest.mark.parametrize("mode, grid, layer, message", [
    ("mean", None, "latent", "--pool mean: use avg or max"),
    (None, 3, "latent", "--grid 3: pooling needs --pool avg or --pool max"),
    ("avg", None, "input", "the input layer has no grid"),
    ("max", 2, "hidden1", "the hidden1 layer has no grid"),
])
def test_refusals(mode, grid, layer, message):
    with pytest.raises(UserError, match=message):
        grid_pool(mode, grid, layer)


def test_default_grid_and_bounds():
    assert grid_pool(None, None, "latent") is None
    assert grid_pool("avg", None, "latent") == GridPool("avg", 2)
    check_grid(GridPool("avg", 8), (8, 8, 128))
    with pytest.raises(UserError, match="--grid 9: the run's latent is 8x8; use a grid of 1 to 8"):
        check_grid(GridPool("avg", 9), (8, 8, 128))


def test_pooled_features_of_a_real_run(tiny_runs, tmp_path):
    """The tiny autoencoder's latent (8x8x4) max-pooled over 2x2 regions: the unpooled latent pooled here,
    and the file says how it was made."""
    run = tiny_runs["ae"]
    plain = extract_features(run, "best", None, batch_size=1000).features
    extraction = extract_features(run, "best", None, batch_size=1000, pool=GridPool("max", 2))
    pooled = extraction.features
    assert pooled.train_x.shape == (5085, 16) and pooled.pool == "max 2x2"
    np.testing.assert_array_equal(pooled.test_x, reference(plain.test_x.reshape(-1, 8, 8, 4), 2, "max"))
    save_features(tmp_path / "f.npz", extraction)
    loaded = load_features(tmp_path / "f.npz")
    assert loaded.layer == "latent (max 2x2-pooled)" and loaded.pool == "max 2x2"


def test_cli_pool_flags(tiny_runs, tmp_path):
    out = tmp_path / "avg4.npz"
    result = mlptrain("extract-features", str(tiny_runs["ae"]), "--pool", "avg", "--grid", "4", "--out", str(out),
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "latent (avg 4x4-pooled) features" in result.stderr
    with np.load(out, allow_pickle=False) as f:
        assert f["train_x"].shape == (5085, 4 * 4 * 4) and str(f["pool"]) == "avg 4x4"
    for args, fragment in ((["--pool", "avg", "--grid", "16"], "--grid 16: the run's latent is 8x8"),
                           (["--grid", "0"], "--grid 0: must be in [1,"),
                           (["--pool", "avg", "--layer", "input"], "the input layer has no grid")):
        result = mlptrain("extract-features", str(tiny_runs["ae"]), *args, "--out", str(tmp_path / "x.npz"),
                          cwd=tmp_path)
        assert_clean_failure(result, fragment)
        assert result.stderr.count("\n") == 1  # no progress display started before the refusal
        assert not (tmp_path / "x.npz").exists()
