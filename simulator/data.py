"""Where the simulator finds the real data named in a scenario.

Relative paths resolve against the working directory first, then against
``edge.core.files.data_root()``: ``$TRICKLE_DATA``, else ``shared/data`` beside the checkout.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from edge.core.errors import DataError
from edge.core.files import data_root


def resolve_data_file(path: str | os.PathLike[str], field: str) -> Path:
    """Return an existing file for ``path`` or raise a DataError naming ``field`` and where it looked."""
    return _resolve(path, field, "file", Path.is_file)


def resolve_data_dir(path: str | os.PathLike[str], field: str) -> Path:
    """Return an existing folder for ``path`` or raise a DataError naming ``field`` and where it looked."""
    return _resolve(path, field, "folder", Path.is_dir)


def _resolve(path: str | os.PathLike[str], field: str, what: str, exists: Callable[[Path], bool]) -> Path:
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, data_root() / p]
    for c in candidates:
        if exists(c):
            return c
    looked = ", ".join(str(c) for c in candidates)
    raise DataError(
        f"{field}: data {what} {str(path)!r} not found (looked in {looked}; give the data folder with --data or TRICKLE_DATA)"
    )
