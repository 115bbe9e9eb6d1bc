"""Run a tutorial page as a reader would: every command and code block, in order, in one folder.

A tutorial (``docs/tutorials/*.md``) is Markdown whose fenced blocks are what the reader types:

- a ``bash`` (or ``sh``) block is a shell script, run with ``bash -euo pipefail`` in the tutorial's
  folder; a command it starts in the background (``trickle serve ... &``) lives on until the tutorial
  ends, when its process group is stopped (its output goes to the block's until then: redirect it to
  a log file to keep it apart);
- a ``python`` block is a script, run with the environment's Python in the same folder (blocks share
  files, never variables: each is what a reader would save and run);
- a block of any other language with a ``title="PATH"`` (``toml``, ``csv``) is a file the reader
  writes: it is written to PATH before the next block runs;
- anything else (``text`` output, a block with no language) is shown, not run.

An HTML comment just before a block (invisible on the site) adjusts how the test runs it:

- ``<!-- test: "--epochs 30" -> "--epochs 2" -->`` runs it with the text replaced (small settings for
  the test; the page shows the reader's). The left side must occur in the block, so a substitution
  cannot silently stop applying;
- ``<!-- test: exit 1 -->`` expects that exit status (a command that must refuse, e.g. with no probe);
- ``<!-- test: expect "bit-exact" -->`` requires that text in the block's output.

The folder starts with ``examples/`` of the checkout (tutorials run from the checkout's root), and
``TRICKLE_DATA`` names the data folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "python": "python"}
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_DIRECTIVE = re.compile(r"^<!--\s*test:\s*(?P<body>.*?)\s*-->\s*$")
_SUBSTITUTION = re.compile(r'^"(?P<old>(?:[^"\\]|\\.)*)"\s*->\s*"(?P<new>(?:[^"\\]|\\.)*)"$')
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass
class Block:
    """One fenced block of a page and what the test does with it."""

    line: int  # where its fence opens (1-based)
    language: str
    title: str | None
    text: str
    substitutions: list[tuple[str, str]] = field(default_factory=list)
    exit_status: int = 0
    expect: list[str] = field(default_factory=list)

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES

    @property
    def writes(self) -> bool:
        return not self.runs and self.title is not None

    def script(self) -> str:
        text = self.text
        for old, new in self.substitutions:
            if old not in text:
                raise ValueError(f"line {self.line}: the test's substitution {old!r} is not in the block")
            text = text.replace(old, new)
        return text


def parse(markdown: str) -> list[Block]:
    """Every fenced block of a page, with the test directives written just before it."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    pending: list[str] = []
    i = 0
    while i < len(lines):
        directive = _DIRECTIVE.match(lines[i].strip())
        if directive:
            pending.append(directive["body"])
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if not fence:
            if lines[i].strip():
                pending = []  # a directive belongs to the block right after it
            i += 1
            continue
        start, marker, indent = i, fence["fence"], len(fence["indent"])
        info = fence["info"].strip()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        i += 1
        language = info.split()[0].lstrip("{.").rstrip("}") if info else ""
        title = _TITLE.search(info)
        block = Block(start + 1, language.lower(), title["title"] if title else None, "\n".join(body) + "\n")
        for body_text in pending:
            _apply(block, body_text)
        pending = []
        blocks.append(block)
    return blocks


def _apply(block: Block, directive: str) -> None:
    substitution = _SUBSTITUTION.match(directive)
    if substitution:
        block.substitutions.append((_unescape(substitution["old"]), _unescape(substitution["new"])))
    elif m := re.fullmatch(r"exit (\d+)", directive):
        block.exit_status = int(m[1])
    elif m := re.fullmatch(r'expect "((?:[^"\\]|\\.)*)"', directive):
        block.expect.append(_unescape(m[1]))
    else:
        raise ValueError(f"line {block.line}: unknown test directive {directive!r}")


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


class TutorialError(AssertionError):
    """A block failed: its line, the command run, its exit status and output."""


@dataclass
class Outcome:
    block: Block
    seconds: float
    output: str


def reader_setup(folder: Path, data: Path) -> dict[str, str]:
    """Make ``folder`` what a reader's checkout offers a tutorial (``examples/``) and return the
    environment they work in: the venv's commands first on PATH, the data folder, plots off-screen."""
    (folder / "examples").symlink_to(Path(__file__).resolve().parents[2] / "examples")
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                TRICKLE_DATA=os.fspath(data), MPLBACKEND="Agg", PYTHONUNBUFFERED="1")


def run(page: Path, folder: Path, env: dict[str, str], timeout_s: float = 600.0) -> list[Outcome]:
    """Run every block of ``page`` in ``folder``; raise ``TutorialError`` at the first that fails."""
    groups: list[int] = []
    outcomes: list[Outcome] = []
    try:
        for block in parse(page.read_text()):
            if block.writes:
                target = folder / str(block.title)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.script())
            elif block.runs:
                outcomes.append(_run_block(page, block, folder, env, timeout_s, groups))
    finally:
        _stop(groups)
    return outcomes


def _run_block(page: Path, block: Block, folder: Path, env: dict[str, str], timeout_s: float,
               groups: list[int]) -> Outcome:
    script = block.script()
    if RUN_LANGUAGES[block.language] == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", script]
    else:
        argv = [sys.executable, "-c", script]
    started = time.monotonic()
    # output to a file, not a pipe: a server the block starts with `&` keeps the pipe open until it exits
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        groups.append(proc.pid)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop([proc.pid])
            proc.wait()
            raise TutorialError(_report(page, block, script, f"timed out after {timeout_s:.0f} s", _read(log))) from None
        output = _read(log)
    seconds = time.monotonic() - started
    if proc.returncode != block.exit_status:
        raise TutorialError(_report(page, block, script, f"exit status {proc.returncode}, expected {block.exit_status}",
                                     output))
    missing = [text for text in block.expect if text not in output]
    if missing:
        raise TutorialError(_report(page, block, script, f"output lacks {missing!r}", output))
    return Outcome(block, seconds, output)


def _read(log: IO[str]) -> str:
    log.seek(0)
    return log.read()


def _report(page: Path, block: Block, script: str, what: str, output: str) -> str:
    tail = output[-6000:]
    return (f"{page.name}, the {block.language} block at line {block.line}: {what}\n"
            f"--- block as run ---\n{script}--- its output (last 6000 characters) ---\n{tail}")


def _stop(groups: list[int]) -> None:
    """Stop what each block left running (a server started with ``&``): SIGTERM, then SIGKILL."""
    alive = []
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGTERM)
            alive.append(pgid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while alive and time.monotonic() < deadline:
        alive = [pgid for pgid in alive if _group_alive(pgid)]
        time.sleep(0.1)
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
