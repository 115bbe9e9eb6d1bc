"""Checkpoints and training summaries on disk, written atomically."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch

from edge.core.errors import DataError
from edge.core.files import write_atomic
from edge.core.tables import markdown_table
from models.data.base import Dataset
from models.data.datasets import DATASETS
from models.data.userdata import fingerprint
from models.nexume.switchable import Arch, SwitchableNet
from models.nexume.train import TrainResult
from models.weights import load_weights

CHECKPOINT_VERSION = 1


def save_checkpoint(result: TrainResult, data: Dataset, out_dir: Path) -> list[Path]:
    """checkpoint.pt, summary.json and summary.md in ``out_dir``."""
    model = result.model
    custom = None if isinstance(model, SwitchableNet) else {
        "spec": model.spec, "input_shape": list(model.input_shape), "n_classes": data.n_classes}
    payload = {
        "version": CHECKPOINT_VERSION,
        "arch": model.arch.to_dict() if custom is None else None,
        "custom": custom,
        "state_dict": result.model.state_dict(),
        "config": result.config.model_dump(mode="json"),
        "labels": list(data.labels),
        "dataset_sha256": fingerprint(result.config.dataset),  # the user's data as trained on (None: built-in)
        "preprocessing": data.preprocessing,
        "variants": result.variants,
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    paths = [out_dir / "checkpoint.pt", out_dir / "summary.json", out_dir / "summary.md"]
    write_atomic(paths[0], buf.getvalue())
    summary = {"config": payload["config"], "train_time_s": result.train_time_s, "history": result.history,
               "variants": result.variants, "dataset": data.name, "n_train": len(data.y_train), "n_test": len(data.y_test)}
    write_atomic(paths[1], json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_atomic(paths[2], _markdown(summary))
    return paths


def load_checkpoint(path: Path, module: torch.nn.Module | None = None) -> tuple[Any, dict[str, Any]]:
    """The trained network and the checkpoint's payload. A user's network is rebuilt from its spec
    (``pkg.module:function``), or from ``module`` (a fresh instance) when it was given in Python."""
    import brevitas.config

    payload = load_weights(path)
    if not isinstance(payload, dict) or payload.get("version") != CHECKPOINT_VERSION or "state_dict" not in payload:
        raise DataError(f"{path}: not a trickle checkpoint (trickle train nexume writes one)")
    custom = payload.get("custom")
    if custom is None:
        model: Any = SwitchableNet(Arch.from_dict(payload["arch"]))
    else:
        from models.nexume.custom import build, switchable

        if module is None and custom["spec"] is None:
            raise DataError(f"{path}: the network was given in Python (models.nexume.custom.fit); pass a fresh instance "
                            "of it to export it (export.bundle.export_bundle(..., module=...))")
        shape = tuple(custom["input_shape"])
        model = switchable(module if module is not None else build(custom["spec"], shape, custom["n_classes"]), shape,
                           custom["spec"])
    # an activation quantizer that never ran in training has no learned scale yet; brevitas
    # initialises it on first use, exactly as it would have in the saved model
    saved, brevitas.config.IGNORE_MISSING_KEYS = brevitas.config.IGNORE_MISSING_KEYS, True
    try:
        model.load_state_dict(payload["state_dict"])
    finally:
        brevitas.config.IGNORE_MISSING_KEYS = saved
    return model, payload


def checkpoint_data(checkpoint: Path, payload: dict[str, Any], dataset: str | None = None,
                    data_root: Path | None = None) -> Dataset:
    """The data set a checkpoint was trained on, split as in training: the path recorded in it (an
    absolute one since issue 33), or ``dataset`` where it is now; an error says where the path came
    from, and data whose content changed since training is refused (its test split would differ)."""
    from models.nexume.train import TrainConfig

    config = dict(payload["config"])
    recorded = config["dataset"]
    if dataset is not None:
        config["dataset"] = str(dataset)
    cfg = TrainConfig.model_validate(config)
    user_data = cfg.dataset not in DATASETS and not cfg.dataset.startswith("ucr:")
    if user_data and not Path(cfg.dataset).exists():
        origin = "--dataset" if dataset is not None else f"the path recorded in {checkpoint} at training time"
        raise DataError(f"dataset {cfg.dataset!r} ({origin}): no such file or folder; pass --dataset PATH to say where "
                        "the data trained on is now")
    want = payload.get("dataset_sha256")
    if user_data and want is not None and fingerprint(cfg.dataset) != want:
        raise DataError(f"dataset {cfg.dataset!r}: its content differs from the data {checkpoint} was trained on "
                        f"({recorded}; sha256 {want[:12]}…), so the test split of the parity checks would not be "
                        "training's; pass --dataset with the data trained on")
    return cfg.load_data(data_root)


def _markdown(summary: dict[str, Any]) -> str:
    cfg = summary["config"]
    headers = ["bits", "dropout", "test accuracy", "MACs", "weight bytes", "energy (µJ)"]
    rows = [(v["bits"], f"{v['drop']:.2f}", f"{v['accuracy']:.3f}", v["macs"], v["weight_bytes"], f"{v['energy_j'] * 1e6:.1f}")
            for v in summary["variants"]]
    lines = [f"# {cfg['method']} on {summary['dataset']}", "",
             f"{summary['n_train']} training / {summary['n_test']} test examples, {cfg['epochs']} epochs, "
             f"seed {cfg['seed']}, {summary['train_time_s']:.1f} s. Energy on `{cfg['mcu']}`.", "",
             markdown_table(headers, rows, align="r" * len(headers))]
    return "\n".join(lines) + "\n"
