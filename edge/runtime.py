"""The device runtime: run a verified bundle's variant with onnxruntime; DynInfer picks the variant.

    bundle = read_bundle("bundles/digits.tar", trusted_keys=[load_public_key("keys/signing.pub")])
    rt = Runtime(bundle)
    logits = rt.infer(x)                                        # the most accurate variant
    logits = rt.infer(x, voltage_v=2.4, capacitance_f=0.01, v_cut_v=2.0, mcu="msp430fr5994")

Never imports torch. Backends sit behind one small interface so LiteRT and the ExecuTorch
runtime can join onnxruntime later.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from edge.bundle import Bundle, BundleError
from edge.dyninfer import Variant, choose_variant, usable_energy_j


class Backend(Protocol):
    def run(self, x: np.ndarray) -> np.ndarray: ...


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
        self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._session.run(None, {self._input: x})[0])


_FORMAT_ORDER = ("onnx-int8", "onnx")  # what a device prefers to run


class Runtime:
    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.manifest: dict[str, Any] = bundle.manifest
        self._backends: dict[str, Backend] = {}

    @property
    def variants(self) -> list[dict[str, Any]]:
        return list(self.manifest["variants"])

    def _format(self, variant: dict[str, Any]) -> str:
        for fmt in _FORMAT_ORDER:
            if fmt in variant["formats"]:
                return fmt
        raise BundleError(f"variant {variant['name']}: no format this runtime can run ({sorted(variant['formats'])})")

    def choose(self, voltage_v: float | None = None, capacitance_f: float | None = None, v_cut_v: float = 0.0,
               mcu: str = "msp430fr5994") -> dict[str, Any]:
        """DynInfer: the variant the stored energy affords; without a voltage, the most accurate."""
        candidates = [v for v in self.variants if v["energy_j"].get(mcu) is not None]
        pool = candidates or self.variants
        options = [Variant(v["bits"], v["drop"], v["energy_j"].get(mcu, 0.0), v["accuracy"][self._format(v)]) for v in pool]
        if voltage_v is None or capacitance_f is None:
            best = max(options, key=lambda o: (o.accuracy, -o.energy_j))
        else:
            best = choose_variant(options, usable_energy_j(voltage_v, capacitance_f, v_cut_v))
        return pool[options.index(best)]

    def infer(self, x: np.ndarray, variant: str | None = None, **energy: Any) -> np.ndarray:
        """Logits for ``x`` (one example, the manifest's input shape without or with the batch axis)."""
        chosen = self._by_name(variant) if variant else self.choose(**energy)
        shape = tuple(self.manifest["inputs"][0]["shape"])
        x = np.asarray(x, dtype=np.float32)
        if x.shape == shape[1:]:
            x = x[None]
        if x.shape != shape:
            raise BundleError(f"input shape {x.shape}: the model takes {shape} (or {shape[1:]})")
        name = chosen["name"]
        if name not in self._backends:
            self._backends[name] = OnnxBackend(self.bundle.file(chosen["formats"][self._format(chosen)]))
        return self._backends[name].run(x)

    def _by_name(self, name: str) -> dict[str, Any]:
        for v in self.variants:
            if v["name"] == name:
                return v
        raise BundleError(f"variant {name!r}: the bundle has {[v['name'] for v in self.variants]}")
