"""Every learning-rate schedule against its closed form, written out here, at several steps
(warmup boundaries, the end of the run and beyond); reduce-on-plateau's multiplier; and the
config combinations that make no schedule."""

import math
import re

import numpy as np
import pytest

from mlptrain.config.load import config_from_dict
from mlptrain.config.schema import ScheduleConfig
from mlptrain.errors import UserError
from mlptrain.optim import schedules
from mlptrain.optim.schedules import SCHEDULES, Plateau, lr_table, make_schedule

BASE, MIN = 1e-2, 1e-4
TOTAL, PER_EPOCH = 100, 10
STEPS = [0, 1, 4, 5, 6, 17, 50, 98, 99, 100, 250]  # 5 = the warmup length below


def schedule(name, total=TOTAL, per_epoch=PER_EPOCH, **options):
    return make_schedule(ScheduleConfig(name=name, **options), BASE, total, per_epoch)


def cosine_from(t, start, total):
    progress = min(max(t - start, 0), total - start) / (total - start)
    return MIN + (BASE - MIN) * 0.5 * (1 + math.cos(math.pi * progress))


def test_every_config_choice_is_a_registered_schedule():
    choices = ScheduleConfig.__dataclass_fields__["name"].metadata["choices"]
    assert set(choices) == set(SCHEDULES)


@pytest.mark.parametrize("t", STEPS)
def test_constant(t):
    assert schedule("constant")(t) == BASE


@pytest.mark.parametrize("t", STEPS)
def test_cosine(t):
    """min_lr + (base - min_lr) (1 + cos(pi t / T)) / 2, held at min_lr from T on."""
    expected = MIN + (BASE - MIN) * 0.5 * (1 + math.cos(math.pi * min(t, TOTAL) / TOTAL))
    assert schedule("cosine", min_lr=MIN)(t) == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_cosine_starts_at_base_passes_the_midpoint_and_ends_at_min_lr():
    lr = schedule("cosine", min_lr=MIN)
    assert lr(0) == pytest.approx(BASE, rel=1e-12)
    assert lr(TOTAL // 2) == pytest.approx((BASE + MIN) / 2, rel=1e-12)
    assert lr(TOTAL) == pytest.approx(MIN, rel=1e-12) and lr(10 * TOTAL) == pytest.approx(MIN, rel=1e-12)


@pytest.mark.parametrize("t", STEPS)
def test_warmup_cosine(t):
    """base (t + 1) / W for t < W (the first step already moves), then cosine from W to T."""
    w = 5
    expected = BASE * (t + 1) / w if t < w else cosine_from(t, w, TOTAL)
    assert schedule("warmup_cosine", min_lr=MIN, warmup_steps=w)(t) == pytest.approx(expected, rel=1e-12)


def test_warmup_reaches_base_at_its_last_step_and_cosine_starts_there():
    lr = schedule("warmup_cosine", min_lr=MIN, warmup_steps=5)
    assert lr(0) == pytest.approx(BASE / 5, rel=1e-12)
    assert lr(4) == pytest.approx(BASE, rel=1e-12) and lr(5) == pytest.approx(BASE, rel=1e-12)
    assert lr(6) < BASE
    assert all(lr(t) <= lr(t - 1) for t in range(6, TOTAL + 1))
    assert all(lr(t) >= lr(t - 1) for t in range(1, 5))


@pytest.mark.parametrize("t", STEPS)
def test_warmup_linear(t):
    """base (t + 1) / W for t < W, then a straight line from base at W to min_lr at T, held there."""
    w = 5
    if t < w:
        expected = BASE * (t + 1) / w
    else:
        expected = BASE + (MIN - BASE) * min(t - w, TOTAL - w) / (TOTAL - w)
    assert schedule("warmup_linear", min_lr=MIN, warmup_steps=w)(t) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", STEPS + [9, 10, 19, 20, 29, 30, 59, 60])
def test_step(t):
    """base gamma^floor(epoch / step_size), epoch = t // steps_per_epoch (optimizer steps)."""
    epoch = t // PER_EPOCH
    expected = BASE * 0.5 ** (epoch // 3)
    assert schedule("step", step_size=3, gamma=0.5)(t) == pytest.approx(expected, rel=1e-12)


def test_step_counts_epochs_in_optimizer_steps():
    """With accumulation an epoch has fewer optimizer steps: the decay follows the epochs, not the steps."""
    lr = schedule("step", per_epoch=4, step_size=2, gamma=0.1)
    assert [lr(t) / BASE for t in (0, 7, 8, 15, 16)] == pytest.approx([1, 1, 0.1, 0.1, 0.01], rel=1e-12)


@pytest.mark.parametrize("t", STEPS + [399, 400, 401, 5000])
def test_inverse_sqrt(t):
    """base d^-0.5 min(s^-0.5, s W^-1.5), s = t + 1 (Vaswani et al. 2017, eq. 3)."""
    w, d = 400, 64
    s = t + 1
    expected = BASE * d**-0.5 * min(s**-0.5, s * w**-1.5)
    lr = schedule("inverse_sqrt", total=10_000, warmup_steps=w, d_model=d)
    assert lr(t) == pytest.approx(expected, rel=1e-12)


def test_inverse_sqrt_peaks_at_the_end_of_warmup():
    w, d = 400, 64
    lr = schedule("inverse_sqrt", total=10_000, warmup_steps=w, d_model=d)
    values = [lr(t) for t in range(2 * w)]
    assert int(np.argmax(values)) == w - 1
    assert values[w - 1] == pytest.approx(BASE * (d * w) ** -0.5, rel=1e-12)


@pytest.mark.parametrize("t", STEPS)
def test_plateau_schedule_is_constant_until_evaluations_say_otherwise(t):
    assert schedule("plateau")(t) == BASE


@pytest.mark.parametrize("epochs, per_epoch, steps", [(1.5, 10, 15), (2, 7, 14), (0.5, 12, 6), (1, 1, 1)])
def test_warmup_epochs_become_optimizer_steps(epochs, per_epoch, steps):
    lr = schedule("warmup_cosine", per_epoch=per_epoch, min_lr=MIN, warmup_epochs=epochs)
    assert lr(0) == pytest.approx(BASE / steps, rel=1e-12)
    assert lr(steps - 1) == pytest.approx(BASE, rel=1e-12)
    assert lr(steps + 1) == pytest.approx(cosine_from(steps + 1, steps, TOTAL), rel=1e-12)


def test_warmup_epochs_and_warmup_steps_give_the_same_schedule():
    by_epochs = lr_table(schedule("warmup_linear", min_lr=MIN, warmup_epochs=2), TOTAL)
    by_steps = lr_table(schedule("warmup_linear", min_lr=MIN, warmup_steps=2 * PER_EPOCH), TOTAL)
    np.testing.assert_array_equal(by_epochs, by_steps)


def test_inverse_sqrt_with_a_warmup_that_rounds_to_zero_steps_stays_finite():
    lr = schedule("inverse_sqrt", per_epoch=3, warmup_epochs=0.1)
    assert all(math.isfinite(lr(t)) and lr(t) > 0 for t in range(10))


def test_lr_table_tabulates_every_step_in_float64():
    lr = schedule("warmup_cosine", min_lr=MIN, warmup_steps=5)
    table = lr_table(lr, TOTAL)
    assert table.dtype == np.float64 and table.shape == (TOTAL,)
    np.testing.assert_array_equal(table, [lr(t) for t in range(TOTAL)])
    assert lr_table(lr, 0).shape == (1,)  # the device always has a step to read


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("base, min_lr, total, per_epoch, warmup", [
    (1e-3, 0.0, 4300, 430, 0), (3e-4, 1e-6, 4300, 430, 430), (0.1, 1e-4, 7, 3, 12), (2.5e-2, 0.0, 1, 1, 1),
    (1, 0, 97, 13, 5), (7.3e-5, 3e-7, 1001, 77, 1000)])
def test_lr_table_is_the_schedule_at_every_step_bit_for_bit(name, base, min_lr, total, per_epoch, warmup,
                                                            monkeypatch):
    """A schedule's own table (cosine, warmup, linear, constant: NumPy's elementwise operations) holds the bits
    of calling it at each step, short runs, warmups longer than the run and integer rates included."""
    lr = make_schedule(ScheduleConfig(name=name, min_lr=min_lr, warmup_steps=warmup), base, total, per_epoch)
    monkeypatch.setattr(schedules, "CACHED_TERMS_MOST", total)  # the longest table below made without the cache
    for steps in (total, max(total - 3, 1), total + 5):
        table = lr_table(lr, steps)
        assert table.dtype == np.float64 and table.flags.c_contiguous
        expected = np.array([lr(t) for t in range(steps)], np.float64)
        np.testing.assert_array_equal(table.view(np.uint64), expected.view(np.uint64))


class TestPlateau:
    """PyTorch's ReduceLROnPlateau counting: strictly better resets, more than `patience` bad
    evaluations in a row multiply by `factor`, and the count starts anew."""

    def test_lower_is_better_for_the_loss(self):
        plateau = Plateau(ScheduleConfig(name="plateau", patience=2, factor=0.5), BASE)
        metrics = [1.0, 0.9, 0.95, 0.92, 0.91, 0.93, 0.8, 0.8, 0.85, 0.9, 0.7]
        expected = [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25]
        assert [plateau.observe(m) for m in metrics] == pytest.approx(expected, rel=1e-15)

    def test_higher_is_better_for_the_accuracy(self):
        plateau = Plateau(ScheduleConfig(name="plateau", patience=1, factor=0.1, metric="val_acc"), BASE)
        metrics = [0.5, 0.6, 0.55, 0.6, 0.7, 0.1, 0.2]
        expected = [1, 1, 1, 0.1, 0.1, 0.1, 0.01]
        assert [plateau.observe(m) for m in metrics] == pytest.approx(expected, rel=1e-12)

    def test_patience_zero_reduces_at_the_first_bad_evaluation(self):
        plateau = Plateau(ScheduleConfig(name="plateau", patience=0, factor=0.5), BASE)
        assert [plateau.observe(m) for m in (1.0, 1.0, 0.5, 0.6)] == pytest.approx([1, 0.5, 0.5, 0.25])

    def test_the_multiplier_stops_at_min_lr(self):
        plateau = Plateau(ScheduleConfig(name="plateau", patience=0, factor=0.5, min_lr=0.3 * BASE), BASE)
        values = [plateau.observe(m) for m in (1.0, 2.0, 3.0, 4.0, 5.0)]
        assert values == pytest.approx([1, 0.5, 0.3, 0.3, 0.3], rel=1e-12)
        assert min(values) * BASE == pytest.approx(0.3 * BASE, rel=1e-12)

    def test_state_dict(self):
        plateau = Plateau(ScheduleConfig(name="plateau", patience=0, factor=0.5), BASE)
        assert np.isnan(plateau.state_dict()["plateau/best"])
        for m in (1.0, 2.0):
            plateau.observe(m)
        state = plateau.state_dict()
        assert float(state["plateau/best"]) == 1.0 and float(state["plateau/multiplier"]) == 0.5
        assert int(state["plateau/bad_evaluations"]) == 0


@pytest.mark.parametrize("schedule_section, fragment", [
    ({"name": "warmup_cosine", "warmup_steps": 10, "warmup_epochs": 1.0},
     "schedule.warmup_steps and schedule.warmup_epochs"),
    ({"name": "cosine", "warmup_steps": 10}, "schedule.name 'cosine' has no warmup"),
    ({"name": "constant", "warmup_epochs": 0.5}, "schedule.name 'constant' has no warmup"),
    ({"name": "step", "warmup_steps": 3}, "schedule.name 'step' has no warmup"),
    ({"name": "plateau", "warmup_steps": 3}, "schedule.name 'plateau' has no warmup"),
    ({"name": "inverse_sqrt"}, "'inverse_sqrt' needs schedule.warmup_steps"),
    ({"name": "linear"}, "schedule.name: 'linear' is not one of"),
    ({"name": "plateau", "factor": 1.0}, "schedule.factor: must be in (0, 1)"),
    ({"name": "plateau", "metric": "train_loss"}, "schedule.metric"),
    ({"name": "step", "gamma": 0}, "schedule.gamma: must be > 0"),
    ({"name": "step", "step_size": 0}, "schedule.step_size: must be > 0"),
    ({"min_lr": -1e-5}, "schedule.min_lr: must be >= 0"),
    ({"name": "warmup_cosine", "warmup_steps": -1}, "schedule.warmup_steps: must be >= 0"),
    ({"name": "warmup_cosine", "warmup_steps": 2.5}, "schedule.warmup_steps: expected int"),
    ({"warmup": 10}, "did you mean 'schedule.warmup_steps'"),
])
def test_bad_schedule_configs_name_the_key(schedule_section, fragment):
    with pytest.raises(UserError, match="^test: .*" + re.escape(fragment)):
        config_from_dict({"schedule": schedule_section}, source="test")


@pytest.mark.parametrize("schedule_section", [
    {"name": "warmup_cosine", "warmup_epochs": 0.5, "min_lr": 1e-5},
    {"name": "warmup_linear", "warmup_steps": 100},
    {"name": "inverse_sqrt", "warmup_steps": 4000, "d_model": 256},
    {"name": "inverse_sqrt", "warmup_epochs": 1},
    {"name": "step", "step_size": 2, "gamma": 0.5},
    {"name": "plateau", "metric": "val_acc", "patience": 0},
])
def test_good_schedule_configs_are_accepted(schedule_section):
    assert config_from_dict({"schedule": schedule_section}).schedule.name == schedule_section["name"]

