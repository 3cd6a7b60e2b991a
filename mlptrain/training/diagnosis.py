"""Why a run learnt nothing or diverged, named from its config and its step state.

A run can end with exit 0 having learnt nothing: a learning rate of 1e6, an fp16 loss scale of 1e300 (every
step skipped as an overflow) or 1e-30 (every gradient underflows to zero), a clip norm of 1e-30 (every
update next to nothing), a weight decay of 1e6 (the weights held at zero, or blown up). `learning_warning`
says so in one line, kept in summary.json's `warnings`; `likely_cause` names the setting, for that line and
for the divergence stop, which blamed the learning rate whatever had happened.
"""

from __future__ import annotations

import math

import numpy as np

CHANCE_MARGIN = 0.01  # accuracy within this of always answering the commonest class is chance
MIN_JUDGED = 100  # test images below which one run's accuracy says too little to warn about
SKIPPED_MOST = 0.5  # fp16: a run that skipped this share of its steps as overflows barely trained
TINY_CLIP = 1e-6  # a gradient-norm clip below this makes every update next to nothing
TINY_SCALE = 1.0  # an fp16 loss scale below this lets small gradients underflow to zero
HUGE_SCALE = 2.0**24  # above this the scaled fp16 gradients overflow (65504 is fp16's largest)
HIGH_LR = {"sgd": 1.0, "momentum": 1.0, "adam": 0.1, "adamw": 0.1}


def likely_cause(config, state: dict | None = None, diverged: bool = True) -> str:
    """The setting most likely to blame when a run diverged (or, `diverged` false, learnt nothing); `state` is
    the optimizer step state (steps, skipped, loss_scale), when known."""
    o, t, schedule = config.optim, config.train, config.schedule
    if t.precision == "fp16":
        steps, skipped = (state or {}).get("steps", 0), (state or {}).get("skipped", 0)
        if t.loss_scale.init > HUGE_SCALE or (steps and skipped >= SKIPPED_MOST * steps):
            return (f"the fp16 loss scale train.loss_scale.init={t.loss_scale.init:g} overflows the gradients"
                    f"{f' ({skipped:,} steps skipped)' if skipped else ''}; keep the default 65536")
        if t.loss_scale.init < TINY_SCALE:
            return (f"the fp16 loss scale train.loss_scale.init={t.loss_scale.init:g} lets the gradients underflow "
                    "to zero; keep the default 65536")
    if t.clip_grad_norm is not None and t.clip_grad_norm < TINY_CLIP:
        return (f"train.clip_grad_norm={t.clip_grad_norm:g} clips every update to next to nothing; clip at about "
                "1, or not at all")
    if o.weight_decay and (o.weight_decay * o.lr >= 0.5 or (o.name == "adam" and o.weight_decay >= 1)):
        how = ("as L2 added to Adam's gradient it outweighs the loss's gradient" if o.name == "adam" else
               f"each step takes lr x weight_decay = {o.lr * o.weight_decay:g} of the weights")
        return (f"the weight decay optim.weight_decay={o.weight_decay:g} is too strong for optim.lr={o.lr:g} "
                f"({how}); try 1e-4 to 0.1")
    if schedule.name == "step" and schedule.gamma > 1:
        return (f"schedule.gamma={schedule.gamma:g} multiplies the learning rate (optim.lr={o.lr}) every "
                f"{schedule.step_size} epoch(s); a decay needs a gamma below 1")
    if diverged or o.lr >= HIGH_LR.get(o.name, 1.0):
        return f"the learning rate optim.lr={o.lr} is likely too high"
    return f"the learning rate optim.lr={o.lr} may be too high or too low, or the run too short"


_BASELINES: dict[tuple[int, int], tuple] = {}  # by the label arrays' ids, each entry holding its arrays


def _baselines(test_labels: np.ndarray, train_labels) -> tuple[float, float]:
    """(the commonest test class's share, the entropy of the training classes' frequencies), counted once for
    the runs that share a dataset: the 16 lanes of a packed sweep end together, each counting 65,000 labels on
    its feeding thread."""
    key = (id(test_labels), id(train_labels))
    entry = _BASELINES.get(key)
    if entry is None or entry[0] is not test_labels or entry[1] is not train_labels:
        chance = np.bincount(test_labels).max() / len(test_labels)
        prior = np.bincount(np.asarray(train_labels)) / max(len(train_labels), 1)
        entry = (test_labels, train_labels, chance, float(-(prior[prior > 0] * np.log(prior[prior > 0])).sum()))
        if len(_BASELINES) >= 4:  # a command's datasets are few: the oldest goes
            _BASELINES.pop(next(iter(_BASELINES)))
        _BASELINES[key] = entry
    return entry[2], entry[3]


def learning_warning(config, record: dict, dataset, mean_image_mse: float | None, state: dict) -> str | None:
    """One line when the run's last evaluation `record` is no better than what knowing nothing of the images
    gives: for a classifier, a test accuracy within CHANCE_MARGIN of always answering the commonest test
    class, or a test loss no lower than predicting the training classes' frequencies (about a fresh model's);
    for the autoencoder, a test MSE no lower than the mean image's. None when it learnt something or the test
    split is too small to tell."""
    labels = np.asarray(dataset.test_labels)
    if len(labels) < MIN_JUDGED:
        return None
    if "test_mse" in record:
        mse = record["test_mse"]
        if mean_image_mse is None or (math.isfinite(mse) and mse < mean_image_mse):
            return None
        said = f"its test MSE {mse:.4g} is no better than the mean image's {mean_image_mse:.4g}"
    else:
        acc, loss = record.get("test_acc"), record.get("test_loss")
        chance, knowing_nothing = _baselines(labels, dataset.train_labels)
        if acc is None or loss is None:
            return None
        if acc > chance + CHANCE_MARGIN and math.isfinite(loss) and loss < knowing_nothing:
            return None
        said = (f"its test accuracy {acc:.4f} is no better than chance ({chance:.4f})" if acc <= chance + CHANCE_MARGIN
                else f"its test loss {loss:.4g} is no better than a fresh model's ({knowing_nothing:.4g})")
    return f"the run learnt nothing: {said}; {likely_cause(config, state, diverged=False)}"
