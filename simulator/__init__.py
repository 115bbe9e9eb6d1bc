"""Discrete-event simulation of energy-harvesting, intermittently powered sensor nodes.

    from simulator import load_scenario, simulate
    result = simulate(load_scenario("simulator/scenarios/nrel_24h.toml"))
    print(result.summary["power_cycles"])

Modules, one concern each: ``harvesters`` (sources → piecewise-constant power traces),
``storage`` (the capacitor and its figures), ``capacitor`` (its ODE in closed form),
``power`` (source coupling and output stages), ``devices`` (MCU and radio profiles),
``workload`` (tasks and intermittent-execution policies), ``node`` (the node state
machine and the exact engine), ``reference`` (fixed-step integrator), ``radio`` (the
path-loss model RF harvesting and the gateway share), ``network`` (gateway, collisions),
``fleet`` (sharded runs), ``summary`` (fleet totals and rates), ``report`` (JSON,
Markdown, plots), ``config`` (the typed scenario).
"""

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from edge.core.errors import ConfigError, DataError

# compiled with mypyc by `make native` when a C compiler is there; TRICKLE_PURE_PYTHON=1 runs their source
NATIVE_MODULES = ("capacitor", "node")


def stale_native_modules() -> list[str]:
    """Compiled modules older than their Python source: Python would import the stale build."""
    here = Path(__file__).parent
    stale = []
    # mypyc puts the compiled code of the group in one library; each module's own .so is a shim
    library = max((p.stat().st_mtime for p in here.glob("_native__mypyc.*.so")), default=0.0)
    for name in NATIVE_MODULES:
        source = here / f"{name}.py"
        for built in here.glob(f"{name}.*.so"):
            if max(built.stat().st_mtime, library) < source.stat().st_mtime:
                stale.append(built.name)
    return stale


class _PythonCore(importlib.machinery.PathFinder):
    """Imports the compiled modules from their Python source (TRICKLE_PURE_PYTHON=1)."""

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in {f"simulator.{m}" for m in NATIVE_MODULES}:
            return None
        source = Path(__file__).parent / f"{name.rsplit('.', 1)[1]}.py"
        return importlib.util.spec_from_file_location(name, source)


if os.environ.get("TRICKLE_PURE_PYTHON"):
    sys.meta_path.insert(0, _PythonCore)
elif stale_native_modules():
    warnings.warn(f"simulator: compiled {', '.join(stale_native_modules())} older than the source; "
                  "run `make native` (or delete them to run as Python)", stacklevel=2)

# the public names, imported on first use: `trickle simulate --help` must not load SimPy and pandas
_LAZY = {"Scenario": "simulator.config", "build_scenario": "simulator.config", "load_scenario": "simulator.config",
         "SimulationResult": "simulator.fleet", "simulate": "simulator.fleet"}

__all__ = ["ConfigError", "DataError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'simulator' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
