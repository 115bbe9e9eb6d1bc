"""Every public class of the tiers says what it is: a module-level class whose name does not start
with an underscore has a docstring."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("edge", "simulator", "models", "export", "server", "trickle", "bench")


def test_every_public_class_has_a_docstring() -> None:
    missing = []
    for tier in TIERS:
        for path in sorted((ROOT / tier).rglob("*.py")):
            tree = ast.parse(path.read_text())
            missing += [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}" for node in tree.body
                        if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not ast.get_docstring(node)]
    assert missing == []
