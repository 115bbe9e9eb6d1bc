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

import warnings
from pathlib import Path
from typing import Any

from edge.errors import ConfigError, DataError

NATIVE_MODULES = ("capacitor", "node")  # compiled with mypyc by `make native` when a C compiler is there


def stale_native_modules() -> list[str]:
    """Compiled modules older than their Python source: Python would import the stale build."""
    here = Path(__file__).parent
    stale = []
    for name in NATIVE_MODULES:
        source = here / f"{name}.py"
        for built in here.glob(f"{name}.*.so"):
            if built.stat().st_mtime < source.stat().st_mtime:
                stale.append(built.name)
    return stale


if stale_native_modules():
    warnings.warn(f"simulator: compiled {', '.join(stale_native_modules())} older than the source; "
                  "run `make native` (or delete them to run as Python)", stacklevel=2)

# the public names, imported on first use: `trickle simulate --help` must not load SimPy and pandas
_LAZY = {"Scenario": "simulator.config", "build_scenario": "simulator.config", "load_scenario": "simulator.config",
         "SimulationResult": "simulator.fleet", "simulate": "simulator.fleet"}

__all__ = ["ConfigError", "DataError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'simulator' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
