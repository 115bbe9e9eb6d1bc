"""The compiled core (``make native``), when present, is built from the current sources and gives
the pure-Python modules' results."""

from __future__ import annotations

import subprocess
import sys

import pytest

import simulator
import simulator.node


def test_compiled_modules_are_not_stale() -> None:
    assert simulator.stale_native_modules() == []


@pytest.mark.skipif(not simulator.node.__file__.endswith(".so"), reason="the core is not compiled here")
def test_compiled_and_python_cores_give_byte_identical_results(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the same scenario in a subprocess that hides the compiled modules (a finder placed before the default)
    script = """
import importlib.machinery, sys, json
class PyOnly(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in ("simulator.node", "simulator.capacitor"):
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            if spec and spec.origin and spec.origin.endswith(".so"):
                source = spec.origin.split(".")[0] + ".py"
                loader = importlib.machinery.SourceFileLoader(name, source)
                return importlib.util.spec_from_file_location(name, source, loader=loader)
            return spec
        return None
import importlib.util
if sys.argv[1] == "py":
    sys.meta_path.insert(0, PyOnly)
from simulator.config import SCENARIO_DIR, load_scenario
from simulator.fleet import simulate
from simulator.report import result_dict
import simulator.node
r = simulate(load_scenario(SCENARIO_DIR / "jit_checkpoint.toml", run={"workers": 1, "duration_s": 300.0}))
print(simulator.node.__file__.rsplit(".", 1)[-1], json.dumps(result_dict(r), sort_keys=True))
"""
    out = {}
    for kind in ("py", "so"):
        done = subprocess.run([sys.executable, "-c", script, kind], capture_output=True, text=True, check=True)
        loaded, doc = done.stdout.split(" ", 1)
        assert loaded == kind
        out[kind] = doc
    assert out["py"] == out["so"]
