"""Launching data-parallel training (``models.nexume.parallel``) through torchrun: the command
line for one machine or several, and the entry point every rank runs (``python -m
models.nexume.launch CONFIG OUT DATA_ROOT``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from edge.core.errors import ConfigError
from models.nexume.checkpoint import save_checkpoint
from models.nexume.parallel import DataParallel
from models.nexume.train import TrainConfig, train


def torchrun_command(config_file: Path, out: Path, data_root: Path | None, nproc: int, nnodes: int = 1,
                     node_rank: int = 0, rdzv_endpoint: str | None = None) -> list[str]:
    """The torchrun command line that trains ``config_file`` (a TrainConfig as JSON) into ``out``."""
    if nproc < 1:
        raise ConfigError("--nproc", nproc, "must be at least 1")
    if nnodes > 1 and not rdzv_endpoint:
        raise ConfigError("--nnodes", nnodes, "more than one node needs --rdzv-endpoint HOST:PORT")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1 and not rdzv_endpoint:
        cmd.append("--standalone")
    else:
        # the same run on every node has the same id; another run against the same endpoint does not
        run_id = hashlib.sha256(config_file.read_bytes() if config_file.exists() else b"").hexdigest()[:16]
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id=trickle-{run_id}"]
    return [*cmd, "-m", "models.nexume.launch", str(config_file), str(out), str(data_root or "")]


def launch(cfg_json: str, out: Path, data_root: Path | None, nproc: int, nnodes: int = 1, node_rank: int = 0,
           rdzv_endpoint: str | None = None) -> dict[str, object]:
    """Train in ``nproc`` processes (per node) through torchrun; the summary rank 0 wrote."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)  # what tells that this node's rank 0 finished
    with tempfile.TemporaryDirectory(prefix="trickle-torchrun-") as tmp:
        config_file = Path(tmp) / "config.json"
        config_file.write_text(cfg_json)
        cmd = torchrun_command(config_file, out, data_root, nproc, nnodes, node_rank, rdzv_endpoint)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise ConfigError("--nproc", nproc, f"torchrun failed (exit {done.returncode}): {done.stdout[-2000:]}")
    if not (out / "summary.json").exists():  # global rank 0 ran on another node and wrote it there
        return {}
    summary: dict[str, object] = json.loads((out / "summary.json").read_text())
    return summary


def main(argv: Sequence[str]) -> int:
    """One rank: train the config, rank 0 saves the checkpoint."""
    config_file, out, data_root = argv
    torch.set_num_threads(1)
    parallel = DataParallel.from_env()
    cfg = TrainConfig.model_validate_json(Path(config_file).read_text())
    data = cfg.load_data(data_root or None)
    result = train(cfg, data, parallel=parallel)
    if parallel is None or parallel.rank == 0:
        save_checkpoint(result, data, Path(out))
    if parallel is not None:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
