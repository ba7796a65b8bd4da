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
        7,
        ["a<b", 1],
        type("Tagged", (str,), {})("a&b"),  # a str subclass (a tagged device name)
        type("Tagged", (str,), {})("plain"),
    ],
)
def test_esc_is_html_escape_of_the_text(value):
    assert esc(value) == html.escape("" if value is None else str(value), quote=True)


def test_table_cells_are_taken_as_html_and_headers_escaped():
    out = table(["a<b"], [["<code>x</code>"]], numeric={0})
    assert "<th>a&lt;b</th>" in out
    assert '<td class="num"><code>x</code></td>' in out


def _reference_table(headers, rows, numeric=frozenset()):
    """The table as it was first written: a cell at a time."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for index, cell in enumerate(row):
            cls = ' class="num"' if index in numeric else ""
            cells.append(f"<td{cls}>{cell}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


@pytest.mark.parametrize(
    ("headers", "rows", "numeric"),
    [
        (["a", "b"], [["1", "2"], ["3", "4"]], {1}),
        (("a", "b", "c"), [["{}", "{0}", "{x}"], ["}{", "%s", ""]], (0, 2)),  # braces are text
        (["a"], [["1", "2", "3"], [], ["4"]], {0, 2}),  # rows longer and shorter than the head
        (["n"], [[1], [None], [2.5]], frozenset()),  # cells that are not strings yet
        (["a", "b"], [], {0}),
    ],
)
def test_table_is_the_cell_by_cell_table(headers, rows, numeric):
    assert table(headers, iter(rows), numeric) == _reference_table(headers, rows, numeric)
