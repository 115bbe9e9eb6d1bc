"""A bundle as the simulated nodes' task: its variants' layer costs from the manifest and each
variant's answers on a test set, computed by the edge runtime (no torch).
Labels are the bundle's label names or class indices (``edge.contract.manifest.label_indices``).

    model = inference_model(read_bundle("bundles/digits.tar"), x_test, y_test)
    result = simulate(scenario, model=model)

    model = early_model(read_bundle("bundles/gestures-early"), series, y)   # early classification
"""

from __future__ import annotations

import math

import numpy as np

from edge.classify.runtime import Runtime
from edge.contract.bundle import Bundle
from edge.contract.manifest import label_indices
from edge.core.errors import BundleError, DataError
from simulator.workload import EarlyTask, InferenceModel, LayerSpec, ModelVariant


def inference_model(bundle: Bundle, x: np.ndarray, y: np.ndarray, backend: str = "onnxruntime", adaptive: bool = True,
                    margin: float = 1.0) -> InferenceModel:
    """The variants the backend runs (the quantized ones if there are any, else the float ones
    costed as 8-bit), most accurate first; ``x`` are model inputs (pre-processed)."""
    runtime = Runtime(bundle, backend=backend)
    truth = label_indices(bundle.manifest.labels, y, "the samples' labels")
    quantized = [v for v in runtime.variants if v.bits < 32]
    variants = []
    for v in sorted(quantized or runtime.variants, key=lambda v: -v.accuracy.get(runtime.format_of(v), 0.0)):
        backend_model = runtime.load(v)
        predicted = np.array([int(np.argmax(backend_model.run(np.asarray(xi, dtype=np.float32)[None]))) for xi in x])
        bits = min(v.bits, 8)  # a float variant runs as 8-bit on a microcontroller
        layers = tuple(LayerSpec(name=layer.name, macs=layer.macs, output_bytes=math.ceil((layer.outputs or 0) * bits / 8))
                       for layer in v.layers)
        correct = predicted == truth
        variants.append(ModelVariant(bits=bits, drop=v.drop, layers=layers, correct=correct,
                                     accuracy=float(correct.mean()), predicted=predicted))
    return InferenceModel(tuple(variants), adaptive=adaptive, margin=margin)


def early_model(bundle: Bundle, series: np.ndarray, y: np.ndarray, integer: bool | None = None,
                full_length: bool = False) -> InferenceModel:
    """An early-decision bundle (``edge.classify.early``) as the nodes' task: per sample, sense and run the
    frame model (for the rocket estimator: update its features, and run a head at each decision
    point, charged per sample as the heads run per sample taken on these series); the rule's
    decision on each raw test series (n, channels, T) says how many samples its task takes and
    whether it is right. ``integer``: the rule in integers (the firmware's; default when the bundle
    has it), else in float. ``full_length``: ignore the rule, sense all T samples and decide at the
    end (the baseline a rule saves against; the rocket estimator runs one head, at T)."""
    from edge.classify.early import early_decider
    from edge.classify.early_rocket import RocketDecider

    early = bundle.manifest.early
    if early is None:
        raise BundleError(f"bundle {bundle.manifest.model}: no early-decision rule")
    integer = early.integer is not None if integer is None else integer
    decider = early_decider(bundle, integer=integer)
    x = np.asarray(series, dtype=np.float32)
    if x.ndim != 3 or x.shape[1:] != (decider.channels, decider.horizon) or len(x) != len(y):
        raise DataError(f"series of shape {x.shape} with {len(y)} labels: expected (n, {decider.channels}, "
                        f"{decider.horizon}) and one label per series")
    labels = bundle.manifest.labels
    decisions = [decider.run(s, to_horizon=full_length) for s in x]
    predicted = np.array([d.label for d in decisions])
    truth = label_indices(labels, y, "the series' labels")
    correct = predicted == truth
    v = bundle.manifest.variants[0]
    bits = 8 if integer else 32
    samples = np.array([d.t for d in decisions])
    head_share = 1.0  # the rocket estimator's head runs at decision points only: its MACs per sample
    if isinstance(decider, RocketDecider):
        points = decider.points
        heads = np.ones(len(x)) if full_length else np.searchsorted(points, samples, side="right")
        head_share = float(heads.sum() / samples.sum())
    layers = tuple(LayerSpec(name=layer.name, macs=round(layer.macs * (head_share if layer.name == "head" else 1.0)),
                             output_bytes=math.ceil((layer.outputs or 0) * min(bits, 8) / 8))
                   for layer in v.layers)
    frame = ModelVariant(bits=min(bits, 8), drop=v.drop, layers=layers, correct=correct, accuracy=float(correct.mean()),
                         predicted=predicted)
    return InferenceModel((frame,), adaptive=False,
                          early=EarlyTask(samples, decider.horizon))
