"""The ranked table a sweep prints: Rich's table for a terminal, and for a log or a pipe the same text laid out
without Rich (mlptrain.sweep.report.results_text), every cell literal."""

import io
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.measure import Measurement

from mlptrain.sweep.report import results_table, results_text

# a parameter's value, a name or a title: brackets as Rich markup would read them, wide characters, accents
TEXT = st.text(st.sampled_from(list("abcXYZ019 .-_:/[]=@#日本é")), min_size=1, max_size=14).filter(str.strip)


def rich_text(table) -> str:
    """What `mlptrain sweep` printed for a table before results_text: Rich's rendering at the table's own width."""
    measure = Console(file=io.StringIO(), width=1000)
    width = Measurement.get(measure, measure.options.update_width(1000), table).maximum
    out = io.StringIO()
    Console(file=out, width=width).print(table)
    return out.getvalue()


@st.composite
def sweeps(draw):
    names = draw(st.lists(TEXT, min_size=0, max_size=4, unique=True))
    states = st.sampled_from(["complete", "complete", "pruned", "failed", "running"])
    rows = []
    for number in range(draw(st.integers(0, 6))):
        params = {name: draw(st.one_of(TEXT, st.floats(1e-6, 1e3), st.integers(-5, 500), st.lists(st.integers(0, 9),
                                                                                                  max_size=3)))
                  for name in names if draw(st.booleans()) or number}
        state = draw(states)
        rows.append({"number": number, "params": params, "state": state,
                     "value": draw(st.floats(-2, 2)) if state == "complete" else None,
                     "run_dir": draw(st.one_of(st.none(), TEXT.map(lambda name: f"/runs/sweep/{name}")))})
    sweep = SimpleNamespace(parameters=[SimpleNamespace(name=name) for name in names], direction=draw(
        st.sampled_from(["maximize", "minimize"])), metric=draw(st.sampled_from(["val_acc", "val_loss", "v[a]l"])))
    return rows, sweep, " ".join(draw(st.lists(TEXT, min_size=1, max_size=12)))


@settings(max_examples=300, deadline=None)
@given(sweeps())
def test_the_plain_table_is_the_text_rich_prints_for_it(case):
    rows, sweep, title = case
    assert results_text(rows, sweep, title) == rich_text(results_table(rows, sweep, title))


def test_a_cell_is_literal_text_not_rich_markup():
    rows = [{"number": 0, "params": {"[red]tag": "[bold]x[/]"}, "state": "complete", "value": 0.5, "run_dir": "/r/t-0"}]
    sweep = SimpleNamespace(parameters=[SimpleNamespace(name="[red]tag")], direction="maximize", metric="val_acc")
    text = results_text(rows, sweep, "[blue]s[/]: 1 trial")
    assert "[bold]x[/]" in text and "[red]tag" in text and "[blue]s[/]: 1 trial" in text
    assert "1 best" in text and text == rich_text(results_table(rows, sweep, "[blue]s[/]: 1 trial"))
