"""Inference backends behind one small interface: ``Backend(model_bytes).run(x) -> logits``.

=============  ======================  =============================================================
backend        bundle formats          package
=============  ======================  =============================================================
onnxruntime    onnx-int8, onnx         onnxruntime (the ``edge`` extra; the default)
litert         tflite, tflite-int8     ai-edge-litert (the ``edge`` extra), TFLite's successor
executorch     pte-xnnpack,            executorch (the ``export`` extra): its Python runtime links
               pte-portable            libtorch, so the backend lives in the export tier
                                       (``export/executorch_backend.py``) and is found through
                                       the ``trickle.backends`` entry point; devices run the C++
                                       runtime
=============  ======================  =============================================================

Each backend takes one batch of the manifest's input shape, float32, and returns float32 logits.
A backend outside ``edge`` registers under the entry point group ``trickle.backends``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from edge.core.errors import TrickleError


class BackendError(TrickleError):
    """A backend that is not installed, or a model file it cannot load."""


class Backend(Protocol):
    """An inference engine for one model file: ``Backend(model_bytes).run(x) -> logits``."""

    def run(self, x: np.ndarray) -> np.ndarray: ...


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence libraries that print progress or banners from Python and from C++ (fds 1 and 2)."""
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as null, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            with contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
                yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


class OnnxBackend:
    """onnxruntime on the CPU, QDQ graphs kept in exact integer semantics.

    Fused u8 x s8 kernels on x86 without VNNI add products pairwise in saturating int16
    (pmaddubsw) and lost 9 points on the digits model; unfused, the integer arithmetic is exact,
    like the firmware's int32 accumulation, and about as fast for models this small.
    """

    def __init__(self, model: bytes) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        try:
            self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for a bad model
            raise BackendError(f"onnxruntime cannot load the model: {e}") from None
        self._input = self._session.get_inputs()[0].name

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._session.run(None, {self._input: x})[0])


def quantize_tflite(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """int8 codes of float values as TFLite's Quantize makes them: round(x / scale) half away from
    zero (x / scale in float32, the rounding exact in float64), plus the zero point, clamped."""
    v = (np.asarray(x, dtype=np.float32) / np.float32(scale)).astype(np.float64)
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return np.clip(q + zero_point, -128, 127).astype(np.int8)


class LiteRtBackend:
    """LiteRT (``ai_edge_litert``) interpreter with its default XNNPACK delegate. A fully-int8 model
    (format ``tflite-int8``) takes float inputs quantized with its input's scale and zero point and
    returns its int8 outputs dequantized."""

    def __init__(self, model: bytes) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise BackendError("the litert backend needs ai-edge-litert: pip install 'trickle[edge]'") from None
        try:
            with quiet():  # "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
                self._interpreter = Interpreter(model_content=model)
                self._interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            raise BackendError(f"LiteRT cannot load the model: {e}") from None
        self._in = self._interpreter.get_input_details()[0]
        self._out = self._interpreter.get_output_details()[0]

    def run(self, x: np.ndarray) -> np.ndarray:
        if self._in["dtype"] == np.int8:
            scale, zero_point = self._in["quantization"]
            x = quantize_tflite(x, scale, zero_point)
        else:
            x = np.ascontiguousarray(x, dtype=np.float32)
        self._interpreter.set_tensor(self._in["index"], x)
        self._interpreter.invoke()
        y = np.array(self._interpreter.get_tensor(self._out["index"]))
        if self._out["dtype"] == np.int8:
            scale, zero_point = self._out["quantization"]
            return ((y.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)
        return y


def _entry_point(name: str) -> Callable[[bytes], Backend]:
    """A backend another tier provides (entry point group ``trickle.backends``), loaded on first use."""

    def load(model: bytes) -> Backend:
        from importlib.metadata import entry_points

        found = entry_points(group="trickle.backends", name=name)
        if not found:
            raise BackendError(f"the {name} backend is not installed: pip install 'trickle[export]'")
        try:
            factory = next(iter(found)).load()
        except ImportError as e:
            raise BackendError(f"the {name} backend cannot load ({e}): pip install 'trickle[export]'") from None
        backend: Backend = factory(model)
        return backend

    return load


# backend name -> (formats it runs, most preferred first; constructor)
BACKENDS: dict[str, tuple[tuple[str, ...], Callable[[bytes], Backend]]] = {
    "onnxruntime": (("onnx-int8", "onnx"), OnnxBackend),
    "litert": (("tflite", "tflite-int8"), LiteRtBackend),
    "executorch": (("pte-xnnpack", "pte-portable"), _entry_point("executorch")),
}
FORMAT_BACKEND = {fmt: name for name, (formats, _) in BACKENDS.items() for fmt in formats}


def load_backend(fmt: str, model: bytes) -> Backend:
    """The backend that runs bundle format ``fmt``, loaded with ``model``."""
    if fmt not in FORMAT_BACKEND:
        raise BackendError(f"format {fmt!r}: no backend runs it (known: {sorted(FORMAT_BACKEND)})")
    return BACKENDS[FORMAT_BACKEND[fmt]][1](model)
