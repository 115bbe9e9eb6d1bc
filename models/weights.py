"""Loading what training wrote, without ever running code from the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge.core.errors import DataError

# data-only constructors a checkpoint may name besides tensors and plain containers: numpy scalars
# and their dtypes (pre-processing statistics saved as numpy floats); none of them runs code
_SAFE_GLOBALS: list[Any] = [np._core.multiarray.scalar, np.dtype,  # type: ignore[attr-defined]
                            *(cls for cls in vars(np.dtypes).values() if isinstance(cls, type) and issubclass(cls, np.dtype))]


def load_weights(path: Path) -> Any:
    """``torch.load`` that never runs code from the file (``weights_only``: tensors and plain
    containers only); a file that is missing, is no torch file or would need code to load is one
    DataError that names the file and never quotes its content."""
    try:
        with torch.serialization.safe_globals(_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"{path}: no such checkpoint file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: a folder, not a checkpoint file") from None
    except Exception as err:  # a pickle that asks for code, a truncated file, not a torch file at all
        raise DataError(f"{path}: not a checkpoint that loads as weights only ({type(err).__name__})") from None
