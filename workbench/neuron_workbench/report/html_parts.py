"""The pieces every HTML section of a report is made of: escaping and tables."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any


def esc(value: Any) -> str:
    """Escape any value for HTML text or attribute context."""
    text = value if type(value) is str else ("" if value is None else str(value))
    # Most of a report's texts (numbers, paths) hold nothing to escape; five substring tests find
    # that faster than a regular expression (a report has thousands of texts).
    if "&" in text or "<" in text or ">" in text or '"' in text or "'" in text:
        return html.escape(text, quote=True)
    return text


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int] = frozenset()
) -> str:
    """A table of ``rows`` of cells that are HTML already (escape text with :func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    rows = list(rows)
    width = max([len(headers), *map(len, rows)])
    opening = ['<td class="num">' if index in numeric else "<td>" for index in range(width)]
    # One format string per row length (a report's tables have hundreds of rows of one length).
    row_formats: dict[int, str] = {}
    body = []
    for row in rows:
        row_format = row_formats.get(len(row))
        if row_format is None:
            cells = "".join(f"{tag}{{}}</td>" for tag in opening[: len(row)])
            row_format = row_formats[len(row)] = f"<tr>{cells}</tr>"
        body.append(row_format.format(*row))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
