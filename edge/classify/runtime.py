"""The device runtime: run a verified bundle's variant; DynInfer picks the variant.

    bundle = read_trusted("bundles/digits.tar", trust=["keys/signing.pub"])
    rt = Runtime(bundle)                                        # onnxruntime; or backend="litert" / "executorch"
    logits = rt.infer(raw)                                      # the most accurate variant
    logits = rt.infer(raw, voltage_v=2.4, capacitance_f=0.01, v_cut_v=2.0, mcu="msp430fr5994")
    logits = rt.infer_features(x)                               # input already pre-processed
    report = rt.self_test()                                     # every variant on the bundle's test vectors

``infer`` applies the manifest's pre-processing (``edge.classify.preprocess``) before the backend, so
every backend sees the same model input. ``edge`` never imports torch; the ExecuTorch backend
comes from the export tier through an entry point (see ``edge/classify/backends.py``).
"""

from __future__ import annotations

import numpy as np

from edge.classify import preprocess
from edge.classify.backends import BACKENDS, Backend, load_backend
from edge.classify.dyninfer import VariantCost, choose_variant, usable_energy_j
from edge.contract.bundle import Bundle
from edge.contract.manifest import Variant
from edge.contract.vectors import PREPROCESS_MAX_ABS_DIFF, SelfTest, TestVectors, check_outputs
from edge.core.errors import BundleError, ConfigError, DataError


class Runtime:
    """A verified bundle on a backend: pre-processing, DynInfer's choice of variant by stored energy,
    inference and the self-test."""

    def __init__(self, bundle: Bundle, backend: str = "onnxruntime") -> None:
        if backend not in BACKENDS:
            raise ConfigError("--backend", backend, f"must be one of {list(BACKENDS)}")
        if bundle.manifest.early is not None:
            raise BundleError(f"bundle {bundle.manifest.model} decides early, sample by sample: run it with "
                              "edge.classify.early.early_decider (trickle edge infer --early)")
        self.bundle = bundle
        self.backend = backend
        self.manifest = bundle.manifest
        self._formats = BACKENDS[backend][0]
        self.variants = [v for v in self.manifest.variants if any(f in v.formats for f in self._formats)]
        if not self.variants:
            raise BundleError(f"backend {backend}: the bundle has no variant in {'/'.join(self._formats)} "
                              f"(it has {sorted({f for v in self.manifest.variants for f in v.formats})})")
        self._loaded: dict[str, Backend] = {}

    def format_of(self, variant: Variant) -> str:
        return next(f for f in self._formats if f in variant.formats)

    def choose(self, voltage_v: float | None = None, capacitance_f: float | None = None, v_cut_v: float = 0.0,
               mcu: str = "msp430fr5994") -> Variant:
        """DynInfer: the variant the stored energy affords; without a voltage, the most accurate.

        Float variants carry no energy cost (they are not for MCUs); when no variant of this
        backend has one, the most accurate runs whatever the energy."""
        known = sorted({m for v in self.variants for m in v.energy_j})
        if known and mcu not in known:
            raise ConfigError("--mcu", mcu, f"the bundle has energy costs for {known}")
        pool = [v for v in self.variants if mcu in v.energy_j] or self.variants
        options = [VariantCost(v.bits, v.drop, v.energy_j.get(mcu, 0.0), v.accuracy.get(self.format_of(v), 0.0))
                   for v in pool]
        if voltage_v is None or capacitance_f is None:
            best = max(options, key=lambda o: (o.accuracy, -o.energy_j))
        else:
            best = choose_variant(options, usable_energy_j(voltage_v, capacitance_f, v_cut_v))
        return pool[options.index(best)]

    def preprocess(self, raw: np.ndarray) -> np.ndarray:
        """The model input (no batch axis) for one raw example, by the manifest's pre-processing."""
        return preprocess.apply(self.manifest.preprocessing, raw)

    def infer(self, raw: np.ndarray, variant: str | None = None, voltage_v: float | None = None,
              capacitance_f: float | None = None, v_cut_v: float = 0.0, mcu: str = "msp430fr5994") -> np.ndarray:
        """Logits (1, classes) for one raw example (as a sensor gives it, see the manifest's ``raw``)."""
        return self.infer_features(self.preprocess(raw), variant, voltage_v, capacitance_f, v_cut_v, mcu)

    def infer_features(self, x: np.ndarray, variant: str | None = None, voltage_v: float | None = None,
                       capacitance_f: float | None = None, v_cut_v: float = 0.0, mcu: str = "msp430fr5994") -> np.ndarray:
        """Logits for one pre-processed example (the model's input shape, with or without the batch axis)."""
        chosen = self.variant(variant) if variant else self.choose(voltage_v, capacitance_f, v_cut_v, mcu)
        shape = self.manifest.input_shape
        x = np.asarray(x, dtype=np.float32)
        if x.shape == shape[1:]:
            x = x[None]
        if x.shape != shape:
            raise DataError(f"input shape {x.shape}: the model takes {shape} (or {shape[1:]})")
        return self.load(chosen).run(x)

    def load(self, variant: Variant) -> Backend:
        """The loaded backend of a variant (loaded once; call ahead to keep loading out of a timing)."""
        if variant.name not in self._loaded:
            fmt = self.format_of(variant)
            self._loaded[variant.name] = load_backend(fmt, self.bundle.file(variant.formats[fmt]))
        return self._loaded[variant.name]

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise ConfigError("--variant", name, f"for the {self.backend} backend the bundle has {[v.name for v in self.variants]}")

    def test_vectors(self) -> TestVectors | None:
        """The bundle's own test vectors, if it carries them (bundles before they existed do not)."""
        info = self.manifest.test_vectors
        return None if info is None else TestVectors.from_bytes(self.bundle.file(info.file), info.file)

    def self_test(self) -> SelfTest | None:
        """Every variant of this backend on the bundle's test vectors, judged against the outputs
        export recorded (``edge.contract.vectors``); where the vectors hold raw inputs, they go through this
        device's pre-processing first, which must give the recorded inputs. None when the bundle
        carries no test vectors."""
        vectors = self.test_vectors()
        if vectors is None:
            return None
        report = SelfTest()
        features = vectors.features
        if vectors.raw is not None:  # the device's own pre-processing, from the raw inputs
            features = np.stack([self.preprocess(raw) for raw in vectors.raw])
            diff = float(np.abs(features - vectors.features).max())
            report.preprocessing_max_abs_diff = diff
            if diff > PREPROCESS_MAX_ABS_DIFF:
                report.failures.append(f"pre-processing: the raw test vectors become inputs {diff:.2e} away from "
                                       f"the recorded ones (> {PREPROCESS_MAX_ABS_DIFF:g})")
        for v in self.variants:
            if v.name not in vectors.expected:
                report.failures.append(f"{v.name}: no expected outputs in the bundle's test vectors")
                continue
            backend = self.load(v)
            got = np.concatenate([backend.run(features[i : i + 1]) for i in range(len(vectors))])
            check_outputs(v.name, v.bits, got, vectors.expected[v.name], report)
        return report
