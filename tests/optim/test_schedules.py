import math

import pytest

from mlptrain.config import ScheduleConfig
from mlptrain.optim.schedules import make_schedule


def test_constant():
    lr = make_schedule(ScheduleConfig(name="constant"), 0.1, 100)
    assert [lr(t) for t in (0, 50, 1000)] == [0.1, 0.1, 0.1]


@pytest.mark.parametrize("step", [0, 1, 17, 50, 99, 100, 250])
def test_cosine_closed_form(step):
    lr = make_schedule(ScheduleConfig(name="cosine", min_lr=1e-4), 1e-2, 100)
    expected = 1e-4 + (1e-2 - 1e-4) * 0.5 * (1 + math.cos(math.pi * min(step, 100) / 100))
    assert lr(step) == pytest.approx(expected, rel=1e-12)


def test_cosine_ends_at_min_lr_and_starts_at_base():
    lr = make_schedule(ScheduleConfig(name="cosine", min_lr=0.0), 3e-3, 10)
    assert lr(0) == pytest.approx(3e-3) and lr(10) == pytest.approx(0.0, abs=1e-15) and lr(5) == pytest.approx(1.5e-3)
