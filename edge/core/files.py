"""Files every tier writes the same way: atomically (temporary name, then rename), secrets with
mode 0600, and the one place where the shared data folder is found.

Nothing half-written is ever left under the final name: a crash leaves either the old file or
the new one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_ENV = "TRICKLE_DATA"


def write_atomic(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_secret(path: str | os.PathLike[str], text: str) -> Path:
    """A file only its owner can read (mode 0600: keys, tokens), written atomically."""
    return write_atomic(path, text, mode=0o600)


def data_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The shared data folder: ``explicit`` (a ``--data`` option), else ``$TRICKLE_DATA``, else
    ``shared/data`` beside the checkout (where the project keeps its data, outside git)."""
    if explicit is not None:
        return Path(explicit).expanduser()
    return Path(os.environ.get(DATA_ENV, REPO_ROOT.parent / "shared" / "data"))
