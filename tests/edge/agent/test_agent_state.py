"""The agent's state on disk, damaged as disks and people damage it: one line naming the file and
the way out, never a traceback or a silent hang or a silent restart; --recover-outbox keeps what
SQLite can still read."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from edge.agent.agent import Agent, AgentConfig, open_outbox
from edge.agent.link import Link
from edge.agent.outbox import Outbox, OutboxDamagedError, recover_outbox
from edge.core.errors import DataError, LinkError

BUNDLE = Path(__file__).parents[1] / "data" / "digits-v1-2026-11.tar"
PUB = Path(__file__).parents[1] / "data" / "digits-v1-2026-11.pub"


def _config(state: Path, **extra: object) -> AgentConfig:
    return AgentConfig(device="n1", token="t" * 16, server="http://127.0.0.1:9", broker="mqtt://127.0.0.1:9",
                       state_dir=state, bundle=BUNDLE, trusted_keys=[PUB], **extra)  # type: ignore[arg-type]


def _filled(state: Path, n: int = 400) -> Path:
    """A state folder whose outbox holds ``n`` queued messages and a cursor (as an agent leaves it)."""
    Agent(_config(state)).outbox.close()
    outbox = Outbox(state / "outbox.sqlite")
    for i in range(n):
        outbox.put(f"n1:result:{i}", "trickle/v1/default/n1/result", b"x" * 200, {"cursor": str(i + 1)})
    outbox.close()
    return state / "outbox.sqlite"


def _run_cli(state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    token = state.parent / "token"
    token.write_text("t" * 16)
    cmd = [sys.executable, "-m", "trickle.cli", "edge", "run", "--device-id", "n1", "--token-file", str(token),
           "--server", "http://127.0.0.1:9", "--broker", "mqtt://127.0.0.1:9", "--bundle", str(BUNDLE),
           "--trust", str(PUB), "--state-dir", str(state), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_a_garbage_outbox_is_one_line_naming_the_file_and_the_recovery(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = _filled(state)
    path.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    proc = _run_cli(state)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert str(path) in line and "damaged" in line and "--recover-outbox" in line


def test_a_corrupt_page_is_found_at_start_and_recovery_keeps_the_rest(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = _filled(state)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = db.execute("PRAGMA page_size").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    data = bytearray(path.read_bytes())
    middle = (pages // 2) * page
    data[middle : middle + page] = b"\xff" * page  # one page in the middle of the table
    path.write_bytes(bytes(data))
    with pytest.raises(OutboxDamagedError, match="--recover-outbox"):
        Outbox(path)
    aside, kept, state_rows = recover_outbox(path)
    assert aside is not None and aside.exists() and aside.read_bytes() == bytes(data)  # saved aside as it was
    assert 300 <= kept < 400 and state_rows == 1
    outbox = Outbox(path)
    assert len(outbox) == kept and outbox.get_state("cursor") == "400"
    outbox.close()
    Agent(_config(state)).outbox.close()  # the agent starts again on the recovered outbox


def test_a_missing_outbox_that_held_messages_is_an_error_not_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = _filled(state)
    path.unlink()
    with pytest.raises(DataError, match="the outbox is missing, but this device queued messages"):
        open_outbox(state)
    outbox = open_outbox(state, recover=True)  # the way out: a new one, said out loud
    assert len(outbox) == 0
    outbox.close()


def test_a_garbage_current_json_names_the_file_and_the_way_out(tmp_path: Path) -> None:
    state = tmp_path / "state"
    Agent(_config(state)).outbox.close()
    (state / "current.json").write_text("{not json")
    with pytest.raises(DataError, match=r"current.json: damaged .*--bundle"):
        Agent(_config(state))
    (state / "current.json").write_text('{"path": "../../etc/passwd"}')
    with pytest.raises(DataError, match="not a bundle in the state folder"):
        Agent(_config(state))
    proc = _run_cli(state)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "current.json: damaged" in proc.stderr


def test_a_sender_that_dies_stops_the_agent_with_its_error(tmp_path: Path) -> None:
    """The outbox breaks under the running sender: the agent raises it instead of waiting for ever."""
    state = tmp_path / "state"
    agent = Agent(_config(state, exit_when_done=True))
    link: Link = agent.link

    def broken(*_: object) -> list[tuple[int, str, bytes]]:
        raise OutboxDamagedError(f"{state / 'outbox.sqlite'}: the outbox is damaged (test)")

    agent.outbox.pending = broken  # type: ignore[method-assign]
    agent.outbox.put("n1:result:0", "trickle/v1/default/n1/result", b"{}")
    link._connected = True  # as if the broker had accepted it
    link._send_guarded()
    assert isinstance(link.failure, OutboxDamagedError)
    with pytest.raises(OutboxDamagedError):
        agent._check_link()
    link.failure = RuntimeError("boom")
    with pytest.raises(LinkError, match="the link's sender stopped: RuntimeError: boom"):
        agent._check_link()
    agent.outbox.close()
    shutil.rmtree(state)
