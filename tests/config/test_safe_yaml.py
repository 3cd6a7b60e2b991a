"""The one YAML reader (mlptrain.config.safe_yaml): hostile documents are one line, quickly, and numbers read as
YAML 1.2 reads them. Hypothesis writes the documents; each must load or be refused with a UserError."""

import copy
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlptrain.config.load import load_config, parse_override
from mlptrain.config.safe_yaml import DUMPERS, MAX_BYTES, MAX_DEPTH, brief, dump_yaml, load_yaml_text, read_yaml
from mlptrain.errors import UserError

BOMB = "\n".join(['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] +
                 [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)])


def refused(text, source="s.yaml"):
    with pytest.raises(UserError) as info:
        load_yaml_text(text, source)
    message = str(info.value)
    assert "\n" not in message and message.startswith(source) and len(message) < 400, message
    return message


def test_an_alias_bomb_is_refused_at_once():
    start = time.perf_counter()
    assert "aliases" in refused(BOMB)
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join(f"{' ' * (i + 1)}k{i}:\n" for i in range(1000)),
                                  "{a: " * 3000 + "1" + "}" * 3000])
def test_deep_nesting_is_one_line(text):
    assert f"more than {MAX_DEPTH} levels" in refused(text)


def test_duplicate_keys_name_the_key_and_both_lines():
    assert "key 'lr' appears twice in one mapping (lines 2 and 4)" in refused("optim:\n  lr: 1\n  name: sgd\n  lr: 2\n")
    assert "key 'train' appears twice in one mapping (lines 1 and 3)" in refused("train:\n  epochs: 3\ntrain:\n  lr: 1\n")


@pytest.mark.parametrize("text, value", [
    ("1_0", "1_0"), ("1:30", "1:30"), ("010", 10), ("0o10", 8), ("0x10", 16), ("yes", "yes"), ("no", "no"),
    ("on", "on"), ("off", "off"), ("True", True), ("1e-3", 1e-3), ("1e3", 1000.0), (".5", 0.5), ("~", None),
    ("2024-01-01", "2024-01-01"), ("'010'", "010"), ("-.inf", float("-inf")),
])
def test_plain_scalars_follow_yaml_1_2(text, value):
    assert load_yaml_text(f"v: {text}", "s") == {"v": value}


@pytest.mark.parametrize("text", ["!!python/object/apply:os.system ['true']", "!!set {a}", "!!binary aGk=", "!!int 1_0",
                                  "{[1]: 2}", "--- 1\n--- 2", "a: \x07", "<<: *x"])
def test_tags_complex_keys_and_garbage_are_one_line(text):
    refused(text)


def test_size_is_bounded(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("description: " + "x" * (48 * 2**20))
    start = time.perf_counter()
    with pytest.raises(UserError, match=f"more than {MAX_BYTES:,} bytes"):
        read_yaml(path)
    assert time.perf_counter() - start < 1.0
    with pytest.raises(UserError, match="not a regular file"):
        read_yaml(__import__("pathlib").Path("/dev/zero"))


def test_overrides_use_the_same_reader():
    with pytest.raises(UserError, match="more than 32 levels"):
        parse_override("model.hidden=" + "[" * 5000 + "]" * 5000)
    with pytest.raises(UserError, match="aliases"):
        parse_override("model.hidden=[&a 1, *a]")
    assert parse_override("seed=010") == ("seed", 10)


def test_a_config_with_duplicates_or_1_1_forms_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    for text, fragment in [("train:\n  epochs: 2\ntrain:\n  batch_size: 8\n", "appears twice"),
                           ("train:\n  epochs: 1_0\n", "train.epochs: expected int, got '1_0'"),
                           ("train:\n  epochs: 1:30\n", "expected int, got '1:30'"),
                           ("train:\n  cuda_graphs: yes\n", "expected bool, got 'yes'")]:
        path.write_text(text)
        with pytest.raises(UserError, match=None) as info:
            load_config(path)
        assert fragment in str(info.value) and "\n" not in str(info.value)


def test_brief_bounds_what_a_message_echoes():
    assert len(brief(list(range(10**6)))) < 120 and len(brief("x" * 10**6)) < 120
    assert "digits" in brief(10**5000) and len(brief({"k" * 1000: [1] * 1000})) < 120


# ---- generated documents

scalars = st.one_of(st.sampled_from(["1_0", "1:30", "010", "yes", "no", "on", "off", "~", "null", "1e400", ".nan",
                                     "0x1F", "0o17", "-.inf", "2024-01-01", "'q'", "\"d\"", "!!str 5", "!!int 7",
                                     "!!float 1", "!!bool true", "!!python/none ''", "*a", "&a 1", "<<", "? x"]),
                    st.integers(-2**80, 2**80).map(str), st.floats(allow_nan=True).map(repr),
                    st.text(alphabet="ab:-[]{},#&*!|>'\"%@` \t", max_size=8))


def _node(depth):
    if depth <= 0:
        return scalars
    return st.one_of(scalars,
                     st.lists(_node(depth - 1), max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
                     st.lists(st.tuples(st.sampled_from(["a", "b", "a", "1", "lr", "~"]), _node(depth - 1)),
                              max_size=4).map(lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_node(4), st.integers(0, 60))
def test_generated_documents_load_or_are_one_line(text, extra_depth):
    document = "[" * extra_depth + text + "]" * extra_depth
    start = time.perf_counter()
    try:
        value = load_yaml_text(document, "gen")
    except UserError as err:
        assert "\n" not in str(err) and len(str(err)) < 400
    else:
        assert extra_depth <= MAX_DEPTH  # at most MAX_DEPTH levels load (the text itself may add none)
        assert load_yaml_text(dump_yaml(value), "again") == value or value != value  # NaN never equals itself
    assert time.perf_counter() - start < 2.0


LIBYAML = pytest.mark.skipif("libyaml" not in DUMPERS,
                             reason="this PyYAML was built without libyaml; dump_yaml uses Python's emitter")


def _same(a, b) -> bool:
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@LIBYAML
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_node(3), st.text(max_size=120))
def test_libyaml_s_emitter_writes_what_reads_back_the_same(text, string):
    """dump_yaml takes libyaml's emitter where PyYAML has it: a mapping as config.yaml holds reads back the same
    (its long escaped strings may fold at other columns than Python's emitter folds them)."""
    try:
        value = load_yaml_text(text, "gen")
    except UserError:
        value = text
    # copies: an object written twice becomes an alias, which the reader refuses (either emitter)
    document = {"key": value, "list": [copy.deepcopy(value), {"inner": string}],
                string or "k": [string, -0.0, float("nan")]}
    assert _same(load_yaml_text(yaml.dump(document, Dumper=DUMPERS["libyaml"], sort_keys=False), "again"), document)


@LIBYAML
def test_the_emitters_write_every_recipes_run_record_alike():
    from mlptrain.config.builtins import builtin_configs
    from mlptrain.training.experiment import run_record

    documents = [run_record(load_config(path)) for path in builtin_configs().values()]
    documents.append({"s": ["1e3", "0o17", ".5", "true", "~", "", "a: b", "x " * 100, "#hash", "- dash", "'q'", '"d"']})
    for document in documents:
        python, libyaml = (yaml.dump(document, Dumper=DUMPERS[name], sort_keys=False) for name in ("python", "libyaml"))
        assert libyaml == python and dump_yaml(document) == libyaml


def test_a_path_of_non_utf8_bytes_is_written_by_python_s_emitter():
    """libyaml encodes UTF-8 only: a path's surrogate escapes (bytes that are no UTF-8, as Python reads them from
    the file system) are written as Python's emitter writes them, not refused."""
    document = {"data": {"root": "/data/caf\udce9/mnist", "path": "x\udcff.npz"}}
    assert dump_yaml(document) == yaml.dump(document, Dumper=DUMPERS["python"], sort_keys=False)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["seed", "train.epochs", "train.batch_size", "model.hidden", "optim.lr", "optim.betas",
                        "train.loss_scale.init", "schedule.warmup_epochs", "description", "data.root"]), _node(3))
def test_generated_overrides_build_a_config_or_are_one_line(tmp_path_factory, key, value):
    path = tmp_path_factory.getbasetemp() / "base.yaml"
    path.write_text("backend: cpu\n")
    try:
        load_config(path, [f"{key}={value}"])
    except UserError as err:
        assert "\n" not in str(err) and len(str(err)) < 600
