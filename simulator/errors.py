"""The simulator's exception family.

A ``ConfigError`` is a bad value in a scenario (the caller's mistake): it names
the field, the value and what is allowed, in one line. A ``DataError`` is input
data that is missing or malformed (a trace file, an I-V curve).
"""

from __future__ import annotations


class SimulatorError(Exception):
    """Base class of every error the simulator raises on purpose."""


class ConfigError(SimulatorError, ValueError):
    """A scenario value is out of range or inconsistent."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field} = {value!r}: {allowed}")


class DataError(SimulatorError):
    """A data file the scenario names is missing or malformed."""
