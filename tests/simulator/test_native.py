"""The compiled core (``make native``), when present, is built from the current sources and gives
the pure-Python modules' results."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import simulator
import simulator.node


def test_compiled_modules_are_not_stale() -> None:
    assert simulator.stale_native_modules() == []


@pytest.mark.skipif(not simulator.node.__file__.endswith(".so"), reason="the core is not compiled here")
def test_compiled_and_python_cores_give_byte_identical_results() -> None:
    script = """
import json, simulator.node
from simulator.config import SCENARIO_DIR, load_scenario
from simulator.fleet import simulate
from simulator.report import result_dict
r = simulate(load_scenario(SCENARIO_DIR / "jit_checkpoint.toml", run={"workers": 1, "duration_s": 300.0}))
print(simulator.node.__file__.rsplit(".", 1)[-1], json.dumps(result_dict(r), sort_keys=True))
"""
    out = {}
    for kind, env in (("py", {"TRICKLE_PURE_PYTHON": "1"}), ("so", {})):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              env={**os.environ, **env})
        loaded, doc = done.stdout.split(" ", 1)
        assert loaded == kind
        out[kind] = doc
    assert out["py"] == out["so"]
