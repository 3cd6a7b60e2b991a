"""The key a user most likely meant when a config key is unknown: matched on the key's last component and
on the names other tools give the same setting (learning_rate for lr, batch for batch_size, ...)."""

from __future__ import annotations

import difflib

# what users type for a key by another name (other tools' spellings): matched on the last component
KEY_ALIASES = {"learning_rate": "lr", "learningrate": "lr", "batch": "batch_size", "bs": "batch_size",
               "batchsize": "batch_size", "epoch": "epochs", "num_epochs": "epochs", "n_epochs": "epochs",
               "max_epochs": "epochs", "wd": "weight_decay", "optimizer": "name", "lr_min": "min_lr",
               "warmup": "warmup_steps", "grad_clip": "clip_grad_norm", "clip": "clip_grad_norm",
               "accumulation_steps": "grad_accum_steps", "grad_accum": "grad_accum_steps", "dtype": "precision",
               "hidden_sizes": "hidden", "layers": "hidden", "device": "backend"}


def suggest_key(dotted: str, keys: list[str]) -> str | None:
    """The valid key a mistyped `dotted` most likely meant: the same last component (or its alias:
    learning_rate -> lr) in the same section, then in any section, then the closest spelling of the last
    component in its section, then of the whole key."""
    section, _, leaf = dotted.rpartition(".")
    leaf = leaf.lower()

    def ranked(candidates):  # the key's own section first
        return sorted(candidates, key=lambda k: k.rpartition(".")[0] != section)

    for wanted in dict.fromkeys((leaf, KEY_ALIASES.get(leaf, leaf))):
        same = ranked([k for k in keys if k.rpartition(".")[2] == wanted])
        if same:
            return same[0]
    in_section = [k for k in keys if k.rpartition(".")[0] == section]
    close = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in in_section], n=1, cutoff=0.6)
    if close:
        return f"{section}.{close[0]}" if section else close[0]
    close = difflib.get_close_matches(dotted, keys, n=1, cutoff=0.6)
    return close[0] if close else None


# values other tools use for a choice of ours
VALUE_ALIASES = {"gpu": "cuda", "float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
                 "autoencoder": "conv_autoencoder", "conv": "conv_autoencoder", "sgd_momentum": "momentum"}


def suggest_value(value: str, choices: list[str]) -> str | None:
    """The choice a mistyped `value` most likely meant: its alias, else the closest spelling."""
    alias = VALUE_ALIASES.get(value.lower())
    if alias in choices:
        return alias
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return close[0] if close else None
