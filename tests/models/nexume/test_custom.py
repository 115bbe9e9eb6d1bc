"""A user's torch.nn.Module through trickle: made switchable-precision, trained with DynFit, exported,
simulated and flashed, from Python (examples/my_network.py, run here) and from the command line."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from torch import nn

from edge.core.errors import ConfigError
from examples.my_network import tiny_cnn
from models.nexume.custom import PrecisionSwitch, build, switchable
from models.nexume.switchable import FLOAT_BITS
from tests.helpers import trickle
from tests.models.data.test_userdata import wide_table, write_audio


def test_switchable_ties_the_weights_and_keeps_the_float_network() -> None:
    torch.manual_seed(0)
    module = tiny_cnn((6, 100), 4)
    original = copy.deepcopy(module).eval()
    net = switchable(module, (6, 100)).eval()
    x = torch.randn(3, 6, 100)
    assert torch.equal(net.configure(FLOAT_BITS, 0.0)(x), original(x))  # float: the user's network, unchanged
    layer = next(m for m in net.modules() if isinstance(m, PrecisionSwitch))
    assert all(q.weight is layer.layer.weight for q in layer.quant.values())  # one weight, every precision
    outs = {b: net.configure(b, 0.0)(x) for b in (2, 4, 8)}
    distinct = [outs[2], outs[4], outs[8], original(x)]
    assert all(not torch.equal(a, b) for i, a in enumerate(distinct) for b in distinct[i + 1:])  # each width quantizes
    # MACs by hand: conv1 16 x 50 outputs x 6 x 5 taps, conv2 24 x 50 x 16 x 3, classifier 4 x 24
    assert [c.macs for c in net.layer_costs()] == [24000, 57600, 96]


def test_a_network_without_layers_or_a_bad_spec_is_one_error() -> None:
    with pytest.raises(ConfigError, match="has no nn.Conv1d, nn.Conv2d or nn.Linear layer"):
        switchable(nn.Sequential(nn.ReLU()), (1, 8))
    with pytest.raises(ConfigError, match=r"--model = 'nowhere': must be pkg.module:function"):
        build("nowhere", (1, 8), 2)
    with pytest.raises(ConfigError, match=r"--model = 'examples.my_network:absent': cannot be imported"):
        build("examples.my_network:absent", (1, 8), 2)


def test_the_python_api_example_trains_exports_simulates_and_flashes(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("needs a C compiler")
    from examples.my_network import main

    got = main(tmp_path)
    assert got["best_variant"]["accuracy"] >= 0.8  # type: ignore[index]
    assert got["firmware_mismatches"] == 0 and got["firmware_variants"] == 1
    assert got["accuracy_within_deadline"] > 0  # type: ignore[operator]


def test_the_command_line_trains_a_users_module_on_a_users_audio_folder(tmp_path: Path) -> None:
    clips = write_audio(tmp_path / "clips", per_class=10)
    out = tmp_path / "train"
    proc = trickle("train", "nexume", "--dataset", str(clips), "--model", "examples.my_network:tiny_cnn",
                   "--epochs", "30", "--set", "batch_size=8", "--set", 'harvest_scenario="rf_powercast"',
                   "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["model"] == "examples.my_network:tiny_cnn" and len(summary["variants"]) == 3
    assert max(v["accuracy"] for v in summary["variants"]) >= 0.75
    proc = trickle("export", str(out / "checkpoint.pt"), "--out", str(tmp_path / "b"), "--formats", "onnx,onnx-int8")
    assert proc.returncode == 0, proc.stderr  # rebuilt from the spec, parity-checked
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["preprocessing"]["steps"][0]["op"] == "mfcc" and {v["drop"] for v in manifest["variants"]} == {0.0}
    # the node simulated on the user's own recordings, raw waveforms through the bundle's MFCC step
    waves, labels = [], []
    for k, label in enumerate(manifest["labels"]):
        for clip in sorted((clips / label).iterdir()):
            waves.append(soundfile.read(clip, dtype="float32")[0])
            labels.append(k)
    raw = np.zeros((len(waves), max(len(w) for w in waves)), np.float32)
    for row, wave in zip(raw, waves):
        row[: len(wave)] = wave
    np.savez(tmp_path / "samples.npz", x=raw, y=np.array(labels))
    proc = trickle("simulate", "--scenario", "rf_powercast", "--bundle", str(tmp_path / "b"), "--samples",
                   str(tmp_path / "samples.npz"), "--nodes", "1", "--duration-s", "300", "--out", str(tmp_path / "sim"),
                   "--no-progress", "--no-plots")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "sim" / "results.json").read_text())["summary"]
    assert summary["released"] > 0 and summary["accuracy_within_deadline"] > 0
    if shutil.which("cc") or shutil.which("gcc"):
        proc = trickle("flash", str(tmp_path / "b"), "--board", "host", "--out", str(tmp_path / "fw"), "--vectors", "4")
        assert proc.returncode == 0, proc.stderr
        assert "bit-exact with onnxruntime" in proc.stdout


def test_a_users_module_on_a_users_table_from_the_command_line_with_a_bad_spec(tmp_path: Path) -> None:
    table = wide_table(tmp_path / "t.csv")
    proc = trickle("train", "nexume", "--dataset", str(table), "--model", "examples.my_network:nothing", "--epochs", "1",
                   "--no-progress", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0
    assert "--model = 'examples.my_network:nothing': cannot be imported" in proc.stderr
