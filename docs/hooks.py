"""MkDocs hooks: pages that are generated from the code at build time, so they cannot go stale.

``<!-- cli-help: VERB -->`` on a line of its own becomes ``trickle VERB --help`` (and the help of
each of its sub-commands), from the command's own parser.

``<!-- config-fields: MODULE:CLASS -->`` becomes the fields of that typed config (a pydantic
``edge.core.config.Config``): a table per TOML table, each field with its type, default and
docstring; a field whose type is itself a config (or a union of configs tagged by ``kind``) is a
table of its own.

``<!-- bench-goals: NAME -->`` becomes the table of ``bench/results/NAME.json``'s goals: each key
with its measured value, its goal and whether it is met, read from the committed results.
"""

from __future__ import annotations

import argparse
import importlib
import json
import operator
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_MARK = re.compile(r"^<!-- cli-help: (?P<verb>[a-z-]+) -->$", re.M)
_GOALS = re.compile(r"^<!-- bench-goals: (?P<name>[\w-]+) -->$", re.M)
_FIELDS = re.compile(r"^<!-- config-fields: (?P<target>[\w.]+:\w+) -->$", re.M)


def _help(parser: argparse.ArgumentParser) -> str:
    os.environ["COLUMNS"] = "100"
    return parser.format_help()


def _verb_parser(verb: str) -> argparse.ArgumentParser:
    from trickle.cli import _parser

    root = _parser([verb])
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction) and verb in action.choices:
            return action.choices[verb]
    raise KeyError(f"docs: no verb {verb!r} in trickle's parser")


def _render(match: re.Match[str]) -> str:
    verb = match["verb"]
    parser = _verb_parser(verb)
    parts = [f"```text\n$ trickle {verb} --help\n{_help(parser)}```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts.append(f"```text\n$ trickle {verb} {name} --help\n{_help(sub)}```")
    return "\n\n".join(parts)


def _configs(annotation: Any) -> list[type]:
    """The config classes a field's type names: itself, the members of a union, or none."""
    from pydantic import BaseModel

    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [c for arg in typing.get_args(annotation) for c in _configs(arg)]
    return []


def _type_name(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = re.sub(r"\b(typing|pathlib|simulator\.\w+|models\.[\w.]+|edge\.[\w.]+)\.", "", text)
    return text.replace("NoneType", "None").replace("|", "\\|")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fields_table(cls: type, path: str, level: int, title: str = "") -> list[str]:
    fields = cls.model_fields  # type: ignore[attr-defined]
    rows, nested = [], []
    for name, info in fields.items():
        configs = _configs(info.annotation)
        if configs:
            nested.append((name, info, configs))
            continue
        default = "required" if info.is_required() else f"`{info.get_default(call_default_factory=True)!r}`"
        rows.append(f"| `{name}` | `{_type_name(info.annotation)}` | {default} | {_cell(info.description or '')} |")
    out = []
    doc = " ".join((cls.__doc__ or "").split())
    if path:
        out.append(f"{'#' * level} {title or f'`[{path}]`'}\n\n{doc}\n")
    if rows:
        out += ["| field | type | default | what |", "| --- | --- | --- | --- |", *rows, ""]
    for name, info, configs in nested:
        sub = f"{path}.{name}" if path else name
        sub_level = level + (1 if path else 0)
        if len(configs) == 1:
            out += _fields_table(configs[0], sub, sub_level)
            continue
        out.append(f"{'#' * sub_level} `[{sub}]`\n\n{_cell(info.description or '')} One of these, chosen by its "
                   "`kind`:\n")
        for config in configs:
            kind = config.model_fields.get("kind")
            title = f'`[{sub}]` kind = "{kind.default}"' if kind is not None else ""
            out += _fields_table(config, sub, sub_level + 1, title)
    return out


def _render_fields(match: re.Match[str]) -> str:
    module, name = match["target"].split(":")
    cls = getattr(importlib.import_module(module), name)
    return "\n".join(_fields_table(cls, "", 2))


_COMPARE = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return "see the JSON"
    return str(value)


def _met(value: Any, goal: str) -> str:
    m = re.fullmatch(r"\s*(<=|>=|<|>|==)\s*(\S+)\s*", str(goal))
    if not m or not isinstance(value, (int, float)) or isinstance(value, bool):
        return ""
    return "met" if _COMPARE[m[1]](value, float(m[2])) else "**not met**"


def _render_goals(match: re.Match[str]) -> str:
    results = json.loads((ROOT / "bench" / "results" / f"{match['name']}.json").read_text())
    rows = ["| key | measured | goal | |", "| --- | ---: | --- | --- |"]
    for key, goal in results.get("goals", {}).items():
        if key in results:
            rows.append(f"| `{key}` | {_value(results[key])} | {goal} | {_met(results[key], goal)} |")
        else:
            rows.append(f"| `{key}` | not measured | {goal} | |")
    measured = results.get("measured")
    if isinstance(measured, dict):
        at = ", ".join(f"{part} at {commit}" for part, commit in measured.items())
        rows.append(f"\nMeasured (commit of each part): {at}.")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    markdown = _MARK.sub(_render, markdown)
    markdown = _GOALS.sub(_render_goals, markdown)
    return _FIELDS.sub(_render_fields, markdown)
