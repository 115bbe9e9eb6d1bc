"""A bundle as the simulated nodes' task: its variants' layer costs from the manifest and each
variant's answers on a test set, computed by the edge runtime (no torch).

    model = inference_model(read_bundle("bundles/digits.tar"), x_test, y_test)
    result = simulate(scenario, model=model)
"""

from __future__ import annotations

import math

import numpy as np

from edge.bundle import Bundle
from edge.runtime import Runtime
from simulator.workload import InferenceModel, LayerSpec, ModelVariant


def inference_model(bundle: Bundle, x: np.ndarray, y: np.ndarray, backend: str = "onnxruntime", adaptive: bool = True,
                    margin: float = 1.0) -> InferenceModel:
    """The variants the backend runs (the quantized ones if there are any, else the float ones
    costed as 8-bit), most accurate first; ``x`` are model inputs (pre-processed)."""
    runtime = Runtime(bundle, backend=backend)
    quantized = [v for v in runtime.variants if v.bits < 32]
    variants = []
    for v in sorted(quantized or runtime.variants, key=lambda v: -v.accuracy.get(runtime.format_of(v), 0.0)):
        backend_model = runtime.load(v)
        predicted = np.array([int(np.argmax(backend_model.run(np.asarray(xi, dtype=np.float32)[None]))) for xi in x])
        bits = min(v.bits, 8)  # a float variant runs as 8-bit on a microcontroller
        layers = tuple(LayerSpec(name=layer.name, macs=layer.macs, output_bytes=math.ceil((layer.outputs or 0) * bits / 8))
                       for layer in v.layers)
        correct = predicted == np.asarray(y)
        variants.append(ModelVariant(bits=bits, drop=v.drop, layers=layers, correct=correct,
                                     accuracy=float(correct.mean()), predicted=predicted))
    return InferenceModel(tuple(variants), adaptive=adaptive, margin=margin)
