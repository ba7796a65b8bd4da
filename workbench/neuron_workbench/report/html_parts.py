"""The pieces every HTML section of a report is made of: escaping and tables."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

#: What :func:`html.escape` replaces: most of a report's texts (numbers, paths) have none of it.
_ESCAPED = re.compile("[&<>\"']")


def esc(value: Any) -> str:
    """Escape any value for HTML text or attribute context."""
    text = "" if value is None else str(value)
    return html.escape(text, quote=True) if _ESCAPED.search(text) else text


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int] = frozenset()
) -> str:
    """A table of ``rows`` of cells that are HTML already (escape text with :func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for index, cell in enumerate(row):
            cls = ' class="num"' if index in numeric else ""
            cells.append(f"<td{cls}>{cell}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
