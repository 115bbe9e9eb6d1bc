"""Data-parallel training through torchrun: 2 processes give one process's model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edge.core.errors import ConfigError
from models.nexume.launch import torchrun_command
from models.nexume.train import TrainConfig, train
from tests.helpers import SUBPROCESS_TIMEOUT_S


def _state(path: Path) -> dict[str, torch.Tensor]:
    payload = torch.load(path / "checkpoint.pt", map_location="cpu", weights_only=False)
    return payload["state_dict"]


def test_two_processes_train_the_model_one_process_trains(tmp_path: Path) -> None:
    # fp32: the one method whose step has no rank-local statistics, so the two runs must agree
    # to float rounding; a batch of 33 leaves the ranks unequal shares (17 and 16)
    cfg = TrainConfig(dataset="digits", method="fp32", epochs=2, batch_size=33, seed=3)
    one = train(cfg, cfg.load_data())
    out = tmp_path / "ddp"
    done = subprocess.run([sys.executable, "-m", "trickle.cli", "train", "nexume", "--dataset", "digits",
                           "--method", "fp32", "--epochs", "2", "--set", "batch_size=33", "--seed", "3",
                           "--nproc", "2", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert done.returncode == 0, done.stderr + done.stdout
    assert json.loads(done.stdout.splitlines()[-1])["nproc"] == 2
    two = _state(out)
    expected = one.model.state_dict()
    assert two.keys() == expected.keys()
    for name, value in expected.items():
        if value.is_floating_point():
            torch.testing.assert_close(two[name], value, rtol=1e-4, atol=1e-5, msg=name)
    # rank 0 alone wrote, atomically: no temporary files left beside the checkpoint
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "summary.json", "summary.md"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["history"][-1]["loss"] == pytest.approx(one.history[-1]["loss"], rel=1e-4)
    assert summary["history"][-1]["train_acc"] == pytest.approx(one.history[-1]["train_acc"], abs=1e-9)


def test_the_torchrun_command_line() -> None:
    single = torchrun_command(Path("c.json"), Path("out"), None, 2)
    assert single[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone"]
    multi = torchrun_command(Path("c.json"), Path("out"), None, 4, nnodes=2, node_rank=1, rdzv_endpoint="h0:29400")
    assert "--nnodes=2" in multi and "--node-rank=1" in multi and "--rdzv-endpoint=h0:29400" in multi
    with pytest.raises(ConfigError, match="rdzv-endpoint"):
        torchrun_command(Path("c.json"), Path("out"), None, 2, nnodes=2)
    with pytest.raises(ConfigError, match="at least 1"):
        torchrun_command(Path("c.json"), Path("out"), None, 0)
