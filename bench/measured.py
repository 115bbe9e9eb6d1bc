"""Which code a benchmark figure was measured on: the commit, marked when the code it depends on has
uncommitted changes (each benchmark's ``measured`` key, per part where it runs in parts)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent


def measured_commit(*paths: str) -> str:
    """The short HEAD commit, with " with uncommitted changes" when any of ``paths`` (relative to the
    repository root) differs from it; "unknown" outside a git checkout."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "unknown"
    changed = subprocess.run(["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True,
                             cwd=ROOT).stdout.strip()
    return commit + (" with uncommitted changes" if changed else "")
