"""A network of your own, trained, exported, simulated and flashed through trickle's Python API.

    python -m examples.my_network OUT_DIR

``tiny_cnn`` is also a ``--model`` spec: ``trickle train nexume --model examples.my_network:tiny_cnn``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch import nn


def tiny_cnn(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """Two convolutions, global average pooling and a classifier, for (channels, length) inputs."""
    channels = input_shape[0]
    return nn.Sequential(
        nn.Conv1d(channels, 16, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv1d(16, 24, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(),
        nn.Linear(24, n_classes),
    )


def main(out: Path) -> dict[str, object]:
    """Train on BasicMotions with DynFit, export the bundle, simulate a node running it, flash the host."""
    from edge.contract.bundle import read_bundle
    from export.bundle import export_bundle
    from export.firmware.flash import flash
    from models.data.datasets import load
    from models.nexume.checkpoint import save_checkpoint
    from models.nexume.train import TrainConfig, fit
    from simulator.bundle_model import inference_model
    from simulator.config import load_scenario, scenario_path
    from simulator.fleet import simulate

    data = load("basic_motions")
    result = fit(tiny_cnn(data.input_shape, data.n_classes), data,
                 TrainConfig(dataset="basic_motions", epochs=80, batch_size=16, harvest_scenario="rf_powercast",
                             model="examples.my_network:tiny_cnn"))
    save_checkpoint(result, data, out)
    bundle = read_bundle(export_bundle(out / "checkpoint.pt", out / "bundle", formats=("onnx", "onnx-int8")))
    model = inference_model(bundle, data.x_test, data.y_test)
    sim = simulate(load_scenario(scenario_path("rf_powercast"), nodes={"count": 2}, run={"workers": 1}), model=model)
    firmware = flash(bundle, "host", out / "firmware", vectors=5)
    best = max(result.variants, key=lambda v: v["accuracy"])
    return {"best_variant": best, "accuracy_within_deadline": sim.summary["accuracy_within_deadline"],
            "firmware_mismatches": firmware["mismatches"], "firmware_variants": len(firmware["variants"])}


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/example")))
