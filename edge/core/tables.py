"""Tables for reports and terminals, drawn one way everywhere (with ``tabulate``).

Cells are shown exactly as given: format numbers into strings first (they are never re-parsed
or re-formatted); anything else goes through ``str``. ``align`` holds one letter per column,
``l``, ``r`` or ``c``; columns it does not reach are left-aligned.

    markdown_table(["term", "J"], [["harvested", "2.597"]], align="lr")
    print(console_table([["availability", "0.015"], ["power failures", "192"]]))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tabulate import tabulate

_ALIGN = {"l": "left", "r": "right", "c": "center"}


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A Markdown (GitHub pipe) table, one line per row, without a trailing newline."""
    return _table(headers, rows, align, "pipe")


def console_table(rows: Iterable[Sequence[object]], headers: Sequence[str] = (), align: str = "") -> str:
    """Plain columns two spaces apart (a header line first, if given), without a trailing newline."""
    return _table(headers, rows, align, "plain")


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str, fmt: str) -> str:
    body = [[str(cell) for cell in row] for row in rows]
    width = max([len(headers), *(len(row) for row in body)])
    colalign = [_ALIGN[a] for a in align[:width].ljust(width, "l")]
    return tabulate(body, headers=list(headers), tablefmt=fmt, colalign=colalign, disable_numparse=True)
