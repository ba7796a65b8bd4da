"""Escaping and tables of the HTML report."""

import html

import pytest

from neuron_workbench.report.html_parts import esc, table


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "model.h[0].attn.c_attn.weight",
        "a<b",
        "x & y",
        'say "hi"',
        "it's",
        "<>&\"'",
        1.5e-3,
        None,
        "",
    ],
)
def test_esc_is_html_escape_of_the_text(value):
    assert esc(value) == html.escape("" if value is None else str(value), quote=True)


def test_table_cells_are_taken_as_html_and_headers_escaped():
    out = table(["a<b"], [["<code>x</code>"]], numeric={0})
    assert "<th>a&lt;b</th>" in out
    assert '<td class="num"><code>x</code></td>' in out
