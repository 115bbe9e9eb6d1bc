"""The device runtime: run a verified bundle's variant; DynInfer picks the variant.

    bundle = read_bundle("bundles/digits.tar", trusted_keys=[load_public_key("keys/signing.pub")])
    rt = Runtime(bundle)                                        # onnxruntime; or backend="litert" / "executorch"
    logits = rt.infer(raw)                                      # the most accurate variant
    logits = rt.infer(raw, voltage_v=2.4, capacitance_f=0.01, v_cut_v=2.0, mcu="msp430fr5994")
    logits = rt.infer_features(x)                               # input already pre-processed

``infer`` applies the manifest's pre-processing (``edge.preprocess``) before the backend, so
every backend sees the same model input. ``edge`` never imports torch; the ExecuTorch backend
comes from the export tier through an entry point (see ``edge/backends.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge import preprocess
from edge.backends import BACKENDS, Backend, load_backend
from edge.bundle import Bundle, BundleError
from edge.dyninfer import Variant, choose_variant, usable_energy_j


class Runtime:
    def __init__(self, bundle: Bundle, backend: str = "onnxruntime") -> None:
        if backend not in BACKENDS:
            raise BundleError(f"backend {backend!r}: must be one of {list(BACKENDS)}")
        self.bundle = bundle
        self.backend = backend
        self.manifest: dict[str, Any] = bundle.manifest
        self._formats = BACKENDS[backend][0]
        self.variants = [v for v in self.manifest["variants"] if any(f in v["formats"] for f in self._formats)]
        if not self.variants:
            raise BundleError(f"backend {backend}: the bundle has no variant in {'/'.join(self._formats)} "
                              f"(it has {sorted({f for v in self.manifest['variants'] for f in v['formats']})})")
        self._loaded: dict[str, Backend] = {}

    def format_of(self, variant: dict[str, Any]) -> str:
        return next(f for f in self._formats if f in variant["formats"])

    def choose(self, voltage_v: float | None = None, capacitance_f: float | None = None, v_cut_v: float = 0.0,
               mcu: str = "msp430fr5994") -> dict[str, Any]:
        """DynInfer: the variant the stored energy affords; without a voltage, the most accurate."""
        candidates = [v for v in self.variants if v["energy_j"].get(mcu) is not None]
        pool = candidates or self.variants
        options = [Variant(v["bits"], v["drop"], v["energy_j"].get(mcu, 0.0), v["accuracy"][self.format_of(v)]) for v in pool]
        if voltage_v is None or capacitance_f is None:
            best = max(options, key=lambda o: (o.accuracy, -o.energy_j))
        else:
            best = choose_variant(options, usable_energy_j(voltage_v, capacitance_f, v_cut_v))
        return pool[options.index(best)]

    def preprocess(self, raw: np.ndarray) -> np.ndarray:
        """The model input (no batch axis) for one raw example, by the manifest's pre-processing."""
        return preprocess.apply(self.manifest["preprocessing"], raw)

    def infer(self, raw: np.ndarray, variant: str | None = None, **energy: Any) -> np.ndarray:
        """Logits (1, classes) for one raw example (as a sensor gives it, see the manifest's ``raw``)."""
        return self.infer_features(self.preprocess(raw), variant, **energy)

    def infer_features(self, x: np.ndarray, variant: str | None = None, **energy: Any) -> np.ndarray:
        """Logits for one pre-processed example (the model's input shape, with or without the batch axis)."""
        chosen = self.variant(variant) if variant else self.choose(**energy)
        shape = tuple(self.manifest["inputs"][0]["shape"])
        x = np.asarray(x, dtype=np.float32)
        if x.shape == shape[1:]:
            x = x[None]
        if x.shape != shape:
            raise BundleError(f"input shape {x.shape}: the model takes {shape} (or {shape[1:]})")
        return self.load(chosen).run(x)

    def load(self, variant: dict[str, Any]) -> Backend:
        """The loaded backend of a variant (loaded once; call ahead to keep loading out of a timing)."""
        name = variant["name"]
        if name not in self._loaded:
            fmt = self.format_of(variant)
            self._loaded[name] = load_backend(fmt, self.bundle.file(variant["formats"][fmt]))
        return self._loaded[name]

    def variant(self, name: str) -> dict[str, Any]:
        for v in self.variants:
            if v["name"] == name:
                return v
        raise BundleError(f"variant {name!r}: for the {self.backend} backend the bundle has {[v['name'] for v in self.variants]}")
