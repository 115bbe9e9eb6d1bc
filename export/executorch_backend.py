"""The ExecuTorch backend: runs ``.pte`` programs (XNNPACK-delegated or portable kernels).

It lives in the export tier, not in ``edge``: the ExecuTorch runtime on PyPI
(``executorch.runtime``) is a pybind11 module that links libtorch and takes ``torch.Tensor``
inputs, and ``edge`` never imports torch. ``edge.classify.backends`` finds it through the
``trickle.backends`` entry point (pyproject.toml) when a caller asks for ``executorch``. On a
device the C++ ExecuTorch runtime runs the same ``.pte`` without torch.
"""

from __future__ import annotations

import numpy as np

from edge.classify.backends import BackendError, quiet


class ExecuTorchBackend:
    """Runs a variant's ``.pte`` program with ExecuTorch (found by edge.classify.backends through an
    entry point)."""

    def __init__(self, model: bytes) -> None:
        try:
            with quiet():  # "experimental API" warnings, torchao's CUDA kernels failing to load
                import torch
                from executorch.runtime import Runtime
        except ImportError:
            raise BackendError("the executorch backend needs the executorch package: pip install 'trickle[export]'") from None
        self._torch = torch
        try:
            with quiet():  # cpuinfo's complaints
                self._method = Runtime.get().load_program(model).load_method("forward")
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"ExecuTorch cannot load the program: {e}") from None

    def run(self, x: np.ndarray) -> np.ndarray:
        out = self._method.execute([self._torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))])
        return np.array(out[0].numpy())
