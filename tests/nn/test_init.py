"""model.init: each scheme against its formula (bounds, variance on large layers, fans of dense and conv
weights), determinism per seed, the models' layers, and the config's one-line refusals."""

import math
import re

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.load import config_from_dict, config_to_dict
from mlptrain.config.schema import BIAS_SCHEMES, WEIGHT_SCHEMES, init_scheme
from mlptrain.errors import UserError
from mlptrain.nn.autoencoder import ConvAutoencoder
from mlptrain.nn.init import bias_init, fans, init_layers, weight_init
from mlptrain.nn.mlp import MLP

# (bound of the uniform, standard deviation), from the papers' and PyTorch's formulas written out here
UNIFORM_BOUND = {
    "pytorch": lambda fan_in, fan_out: math.sqrt(1.0 / fan_in),  # gain sqrt(2 / (1 + 5)) * sqrt(3 / fan_in)
    "he_uniform": lambda fan_in, fan_out: math.sqrt(2.0) * math.sqrt(3.0 / fan_in),
    "glorot_uniform": lambda fan_in, fan_out: math.sqrt(6.0 / (fan_in + fan_out)),
}


def test_fans_of_dense_and_conv_weights():
    assert fans((784, 512)) == (784, 512)  # stored (K, N): fan_in K
    assert fans((3, 3, 256, 128)) == (9 * 256, 9 * 128)  # (KS, KS, Cin, Cout), as torch counts Conv2d
    with pytest.raises(ValueError):
        fans((5,))


@pytest.mark.parametrize("scheme", sorted(UNIFORM_BOUND))
@pytest.mark.parametrize("shape", [(1024, 256), (3, 3, 64, 96), (5, 5, 3, 8)])
def test_uniform_weights_fill_their_bound(scheme, shape):
    rng = np.random.default_rng(0)
    w = weight_init(rng, scheme, shape)
    fan_in, fan_out = fans(shape)
    bound = UNIFORM_BOUND[scheme](fan_in, fan_out)
    assert w.dtype == np.float32 and w.shape == shape
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.99 * bound  # the whole interval is used, not a narrower one
    # variance of U(-a, a) is a^2 / 3; 260k+ draws hold it to well under 2%
    if w.size > 100_000:
        assert w.var() == pytest.approx(bound**2 / 3, rel=0.02)
        assert abs(w.mean()) < 0.01 * bound


@pytest.mark.parametrize("shape", [(2048, 256), (3, 3, 256, 128)])
def test_he_normal_has_variance_two_over_fan_in(shape):
    w = weight_init(np.random.default_rng(1), "he_normal", shape)
    fan_in, _ = fans(shape)
    assert w.var() == pytest.approx(2.0 / fan_in, rel=0.02)
    assert abs(w.mean()) < 0.01 * math.sqrt(2.0 / fan_in)
    assert np.abs(w).max() > 3 * math.sqrt(2.0 / fan_in)  # a normal's tails, not a truncated one


def test_biases():
    rng = np.random.default_rng(2)
    b = bias_init(rng, "pytorch", 100_000, fan_in=400)
    assert np.abs(b).max() <= 1 / 20 and np.abs(b).max() > 0.99 / 20
    assert b.var() == pytest.approx((1 / 20) ** 2 / 3, rel=0.02)
    assert not bias_init(rng, "zeros", 7, fan_in=3).any()


def test_every_config_scheme_has_a_formula():
    for weights in WEIGHT_SCHEMES:
        for biases in BIAS_SCHEMES:
            out = init_layers(np.random.default_rng(0), [("fc1", (4, 3))], weights, biases)
            assert out["fc1.weight"].shape == (4, 3) and out["fc1.bias"].shape == (3,)


@pytest.mark.parametrize("weights", WEIGHT_SCHEMES)
def test_same_seed_same_parameters_other_seed_other(weights):
    layers = [("fc1", (20, 10)), ("fc2", (10, 5))]
    a, b = (init_layers(np.random.default_rng(7), layers, weights, "pytorch") for _ in range(2))
    c = init_layers(np.random.default_rng(8), layers, weights, "pytorch")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["fc1.weight"], c["fc1.weight"])


def test_models_draw_each_layer_from_its_own_fans():
    backend = CpuBackend()
    mlp = MLP(backend, 784, [512, 64], 10, "relu", max_rows=2)
    mlp.init_parameters(np.random.default_rng(0), "pytorch", "pytorch")
    p = mlp.params.to_host_dict()
    for name, fan_in in (("fc1", 784), ("fc2", 512), ("fc3", 64)):
        assert 0.98 / math.sqrt(fan_in) < np.abs(p[f"{name}.weight"]).max() <= 1 / math.sqrt(fan_in)
        assert 0 < np.abs(p[f"{name}.bias"]).max() <= 1 / math.sqrt(fan_in)
    ae = ConvAutoencoder(backend, (8, 8, 3), [16, 8], 3, max_rows=2)
    ae.init_parameters(np.random.default_rng(0), "he_uniform", "zeros")
    p = ae.params.to_host_dict()
    for i, (cin, _) in enumerate(ae.convs, start=1):
        bound = math.sqrt(6.0 / (9 * cin))
        assert 0.9 * bound < np.abs(p[f"conv{i}.weight"]).max() <= bound
        assert not p[f"conv{i}.bias"].any()


def test_config_defaults_and_their_record():
    mlp = config_from_dict({})
    assert init_scheme(mlp.model) == (mlp.model.init.weights, mlp.model.init.biases)
    assert mlp.model.init.weights in WEIGHT_SCHEMES
    # biases follow the weights unless given
    he = config_from_dict({"model": {"init": {"weights": "he_normal"}}})
    assert (he.model.init.weights, he.model.init.biases) == ("he_normal", "zeros")
    torch_zero = config_from_dict({"model": {"init": {"weights": "pytorch", "biases": "zeros"}}})
    assert torch_zero.model.init.biases == "zeros"
    # what a run records is explicit, and reads back as itself
    assert config_from_dict(config_to_dict(he)) == he
    assert config_to_dict(he)["model"]["init"] == {"weights": "he_normal", "biases": "zeros"}


@pytest.mark.parametrize("raw, message", [
    ({"model": {"init": {"weights": "he"}}}, "model.init.weights: 'he' is not one of pytorch, he_uniform"),
    ({"model": {"init": {"biases": "ones"}}}, "model.init.biases: 'ones' is not one of pytorch, zeros"),
    ({"model": {"init": {"weight": "pytorch"}}}, "unknown key 'model.init.weight'; did you mean 'model.init.weights'"),
    ({"model": {"init": "pytorch"}}, "model.init must be a mapping of keys to values (its keys: weights, biases)"),
    ({"model": {"init": {"weights": 3}}}, "model.init.weights: expected str, got 3"),
])
def test_config_refusals_name_the_key(raw, message):
    with pytest.raises(UserError, match=re.escape(message)) as err:
        config_from_dict(raw)
    assert "\n" not in str(err.value)


def test_a_section_given_a_plain_value_names_its_keys(tmp_path):
    from mlptrain.config.load import load_config

    path = tmp_path / "c.yaml"
    path.write_text("model: {type: mlp}\n")
    with pytest.raises(UserError) as err:
        load_config(path, ["model.init=pytorch"])
    assert str(err.value) == ("override model.init=pytorch: model.init is a section; set one of its keys "
                              "(model.init.weights, model.init.biases)")
    assert load_config(path, ["model.init={weights: he_normal}"]).model.init.biases == "zeros"


def test_a_seeds_draws_are_made_once_for_the_models_that_share_them(monkeypatch):
    """A sweep's trials share a few seeds: a model of a seed, layers and schemes drawn before gets the same
    read-only draws, equal to drawing afresh from default_rng(seed); another seed, layer shape or scheme draws its
    own; a model over KEPT_MOST parameters is drawn each time; at most KEPT draws are kept."""
    from mlptrain.nn import init

    layers = (("fc1", (6, 4)), ("fc2", (4, 3)))
    first = init.seeded_layers(11, layers, "pytorch", "pytorch")
    assert init.seeded_layers(11, layers, "pytorch", "pytorch") is first
    fresh = init_layers(np.random.default_rng(11), layers, "pytorch", "pytorch")
    assert list(first) == list(fresh) and all(np.array_equal(first[k], fresh[k]) for k in fresh)
    assert not first["fc1.weight"].flags.writeable
    assert init.seeded_layers(12, layers, "pytorch", "pytorch") is not first
    assert init.seeded_layers(11, (("fc1", (6, 5)), ("fc2", (5, 3))), "pytorch", "pytorch") is not first
    assert init.seeded_layers(11, layers, "he_uniform", "pytorch") is not first
    for seed in range(100, 100 + init.KEPT):  # the oldest draws go first
        init.seeded_layers(seed, layers, "pytorch", "pytorch")
    assert init.seeded_layers(11, layers, "pytorch", "pytorch") is not first
    monkeypatch.setattr(init, "KEPT_MOST", 10)
    big = init.seeded_layers(13, layers, "pytorch", "pytorch")
    assert init.seeded_layers(13, layers, "pytorch", "pytorch") is not big
