"""Discrete-event simulation of energy-harvesting, intermittently powered sensor nodes.

    from simulator import load_scenario, simulate
    result = simulate(load_scenario("simulator/scenarios/nrel_24h.toml"))
    print(result.summary["power_cycles"])

Modules, one concern each: ``harvesters`` (sources → piecewise-constant power traces),
``storage`` (the capacitor ODE in closed form), ``devices`` (MCU and radio profiles),
``workload`` (tasks and intermittent-execution policies), ``node`` (the node state
machine and the exact engine), ``reference`` (fixed-step integrator), ``network``
(gateway, path loss, collisions), ``fleet`` (sharded runs), ``report`` (JSON,
Markdown, plots), ``config`` (the typed scenario).
"""

from simulator.config import Scenario, build_scenario, load_scenario
from simulator.errors import ConfigError, DataError, SimulatorError
from simulator.fleet import SimulationResult, simulate

__all__ = [
    "ConfigError",
    "DataError",
    "Scenario",
    "SimulationResult",
    "SimulatorError",
    "build_scenario",
    "load_scenario",
    "simulate",
]
