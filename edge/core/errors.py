"""The one exception family of trickle: every error a user can cause derives from ``TrickleError``.

``trickle <verb>`` catches ``TrickleError`` once and prints it as one line (exit status 1);
anything else is a bug and keeps its traceback. Each subclass names what the user got wrong:

- ``ConfigError(field, value, allowed)``: a value of a config, flag or scenario is out of range;
- ``DataError``: an input or data file is missing or malformed;
- ``BundleError``: a bundle or key is missing, malformed, tampered with or untrusted;
- ``LinkError``: the server or broker refused or could not be reached;
- ``ExportError``, ``FlashError``: a checkpoint that cannot be exported, a build or board that failed.

Kept free of imports so that every tier, and ``trickle --help``, can load it for nothing.
"""

from __future__ import annotations


class TrickleError(Exception):
    """Base of every error trickle raises on purpose for a user's input, config or environment."""


class ConfigError(TrickleError):
    """A configuration value (a field of a typed config, a flag) is out of range or inconsistent."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field} = {value!r}: {allowed}")

    def __reduce__(self) -> tuple[type, tuple[str, object, str]]:  # raised in a worker process, it arrives whole
        return ConfigError, (self.field, self.value, self.allowed)


class DataError(TrickleError):
    """An input or data file is missing or malformed (a trace, a data set, a raw example)."""


class BundleError(TrickleError):
    """A bundle or key is missing, malformed, tampered with, or untrusted."""


class LinkError(TrickleError):
    """The server or the broker refused a request or could not be reached."""


class ExportError(TrickleError):
    """A checkpoint that cannot be exported, or a format that misses parity with PyTorch."""


class FlashError(TrickleError):
    """A missing toolchain, a failed firmware build, or a board that did not finish."""
