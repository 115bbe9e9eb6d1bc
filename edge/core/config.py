"""Typed configuration shared by every tier: a pydantic base, TOML files, ``--set`` overrides.

    class ServeConfig(Config):
        port: int = Field(8080, ge=1, le=65535)
        \"\"\"HTTP port.\"\"\"

    config = load_config(ServeConfig, path="serve.toml", sets=["port=8443"], flags={"host": "0.0.0.0"})

Precedence: defaults < the TOML file < flags given on the command line < ``--set`` items. A
bad value fails at load with one ``ConfigError`` naming the field, the value and what is
allowed. ``--set`` takes ``FIELD=VALUE`` or ``SECTION.FIELD=VALUE`` with the value in TOML
syntax (``0.047``, ``true``, ``"jit"``, ``[1, 2]``); a bare word stays a string.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from edge.core.errors import ConfigError

C = TypeVar("C", bound="Config")


class Config(BaseModel):
    """Base of every typed config: unknown keys are errors, values are frozen, every field has a
    docstring (shown by ``--help`` where a verb lists its config) and SI units in its name."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def parse_toml_value(raw: str) -> Any:
    """A command-line value in TOML syntax (0.047, true, "jit", [1, 2]); a bare word stays a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def parse_set(item: str) -> tuple[list[str], Any]:
    """``SECTION.FIELD=VALUE`` (or ``FIELD=VALUE``) as (the dotted path's parts, the parsed value)."""
    key, sep, raw = item.partition("=")
    parts = [p.strip() for p in key.split(".")]
    if not sep or not all(parts):
        raise ConfigError("--set", item, "expected FIELD=VALUE or SECTION.FIELD=VALUE, e.g. storage.capacitance_f=0.047")
    return parts, parse_toml_value(raw)


def apply_sets(data: dict[str, Any], items: Iterable[str]) -> dict[str, Any]:
    """``data`` with every ``--set`` item applied (nested tables created as needed)."""
    for item in items:
        parts, value = parse_set(item)
        table = data
        for part in parts[:-1]:
            nested = table.setdefault(part, {})
            if not isinstance(nested, dict):
                raise ConfigError("--set", item, f"{part} is a value, not a table")
            table = nested
        table[parts[-1]] = value
    return data


def read_toml(path: str | os.PathLike[str], option: str = "--config") -> dict[str, Any]:
    """A TOML file's tables; a missing or invalid file is one ConfigError naming ``option``."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(option, str(path), "file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(option, str(path), f"not valid TOML: {e}") from None


def merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``overrides``, tables merged key by key."""
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


def load_config(cls: type[C], path: str | os.PathLike[str] | None = None, sets: Iterable[str] = (),
                flags: Mapping[str, Any] | None = None, source: str | None = None) -> C:
    """Defaults, then the TOML file, then ``flags`` (None values skipped), then ``--set`` items."""
    data = read_toml(path) if path is not None else {}
    merge(data, {k: v for k, v in (flags or {}).items() if v is not None})
    apply_sets(data, sets)
    return validate(cls, data, source or (str(path) if path is not None else cls.__name__))


def validate(cls: type[C], data: Mapping[str, Any], source: str, tags: frozenset[str] = frozenset()) -> C:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise one_line_error(e, source, tags) from None


def one_line_error(e: ValidationError, source: str, tags: frozenset[str] = frozenset()) -> ConfigError:
    """The first problem of a ValidationError as one ConfigError: field, value, what is allowed.

    ``tags``: the discriminator values of tagged unions, which pydantic puts in the error's path
    (``harvester.rf.distance_m``) though a user never writes them there.
    """
    err = e.errors()[0]
    loc = [str(p) for i, p in enumerate(err["loc"]) if not (i > 0 and str(p) in tags)]
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    if err["type"] == "union_tag_invalid":  # an unknown kind of a tagged union
        ctx = err.get("ctx") or {}
        return ConfigError(".".join([*loc, "kind"]), ctx.get("tag"), f"must be one of {ctx.get('expected_tags')}{more}")
    value = "missing" if err["type"] == "missing" else err.get("input", "")
    return ConfigError(".".join(loc) or source, value, err["msg"].replace("Input should", "should") + more)
