"""The store's contract, the same tests on SQLite and on a real PostgreSQL (a throwaway cluster from
Debian's postgresql package, started on a free loopback port)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.store.pgtemp import available
from server.store.store import (
    MIGRATIONS,
    Incoming,
    JobNotFinishedError,
    PostgresStore,
    Store,
    StoreError,
    VersionTakenError,
    open_store,
    redact,
)
from tests.server.conftest import fresh_database

needs_postgres = pytest.mark.skipif(not available(), reason="apt-get install postgresql")


_databases = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = open_store(tmp_path / "db.sqlite")
    else:
        s = open_store(fresh_database(request.getfixturevalue("postgres_url"), f"store{next(_databases)}"))
        assert isinstance(s, PostgresStore)
    yield s
    s.close()


def _messages(device: str, keys: range, kind: str = "telemetry") -> list[Incoming]:
    return [Incoming(f"{device}:{kind}:{i}", device, kind, float(i), 100.0 + i, f'{{"i": {i}}}') for i in keys]


def test_the_dashboard_aggregates_page_first_and_filter_literally(store: Store) -> None:
    for name, fleet in (("a_1", "Lab"), ("ab1", "lab"), ("b%2", "field")):
        store.add_device(name, fleet)
    rows = [Incoming("a_1:r:0", "a_1", "result", 1.0, 50.0, "{}", correct=True, bundle_version=2),
            Incoming("a_1:r:1", "a_1", "result", 2.0, 60.0, "{}", correct=False, bundle_version=2),
            Incoming("a_1:s:0", "a_1", "status", 9.0, 40.0, "{}", state="online"),
            Incoming("a_1:s:1", "a_1", "status", 1.0, 70.0, "{}", state="offline"),  # a will: older ts, last received
            Incoming("ab1:r:0", "ab1", "result", 1.0, 50.0, "{}")]
    store.add_messages(rows)
    matching, page = store.fleet_page(now_s=100.0, online_s=300.0, search="A_")
    assert matching == 1 and [r["device"] for r in page] == ["a_1"]  # '_' is literal, case folded
    row = page[0]
    assert (row["results"], row["labelled"], row["correct"], row["running_version"], row["online"]) == (2, 2, 1, 2, False)
    assert store.fleet_page(100.0, 300.0, search="%")[0] == 1
    matching, page = store.fleet_page(100.0, 300.0, offset=1, limit=1)
    assert matching == 3 and [r["device"] for r in page] == ["ab1"]
    totals = store.fleet_totals(100.0, 300.0)
    assert (totals["devices"], totals["online"], totals["results"], totals["labelled"]) == (3, 1, 3, 2)
    assert store.messages("a_1", "result", limit=1, newest=True)[0] == {}  # the newest one, in time order
    with pytest.raises(StoreError, match="server's own MQTT user"):
        store.add_device("trickle-server", "f")


def test_the_dashboard_pages_in_natural_order_with_each_devices_newest_telemetry(store: Store) -> None:
    for k in (10, 2, 1, 0, 11):
        store.add_device(f"n{k}", "f")
    store.add_messages([  # by the device's time, not by arrival: the final telemetry arrived first
        Incoming("n2:t:final", "n2", "telemetry", 28800.0, 50.0, '{"power_cycles": 7, "on_time_s": 123.5}'),
        Incoming("n2:t:0", "n2", "telemetry", 600.0, 60.0, '{"power_cycles": 1, "on_time_s": 9.0}')])
    matching, page = store.fleet_page(100.0, 300.0, offset=1, limit=3)
    assert matching == 5 and [r["device"] for r in page] == ["n1", "n2", "n10"]
    assert (page[1]["power_cycles"], page[1]["on_time_s"]) == (7, 123.5)
    assert (page[0]["power_cycles"], page[0]["on_time_s"]) == (None, None)


def test_results_are_counted_in_the_devices_own_time(store: Store) -> None:
    store.add_device("sim", "f")
    store.add_device("real", "f")
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z, on the hour
    virtual = [Incoming(f"sim:r:{i}", "sim", "result", 60.0 * i + 1.0, now, "{}") for i in range(480)]  # 8 h, 1/min
    real = [Incoming(f"real:r:{i}", "real", "result", now - 3600.0 * i - 1.0, now, "{}") for i in (0, 0.5, 3, 30)]
    store.add_messages(virtual + real)
    virtual_series, wall = store.results_over_time(now)
    assert virtual_series == {"clock": "virtual", "start_s": 0.0, "bin_s": 600.0, "counts": [10] * 48}
    assert wall["clock"] == "wall" and wall["start_s"] == now - 24 * 3600.0 and wall["bin_s"] == 3600.0
    assert wall["counts"][-1] == 2 and wall["counts"][-4] == 1 and sum(wall["counts"]) == 3  # 30 h ago: out
    store.add_messages([Incoming("sim:r:late", "sim", "result", 8 * 3600.0 - 0.5, now, "{}")])
    assert store.results_over_time(now)[0]["counts"][-1] == 11  # the last instant falls in the last bin


def test_the_dashboard_keeps_the_servers_clock_and_the_devices_apart(store: Store) -> None:
    # a simulated fleet replays 8 h of its own time in seconds of the server's, then signs off: it was
    # "offline, last seen 0 s ago" on one row with "results received, last hour" counting all 8 h
    now = 1_800_000_000.0
    store.add_device("sim", "f")
    store.add_device("real", "f")
    store.add_device("quiet", "f")
    sim = [Incoming(f"sim:r:{i}", "sim", "result", 60.0 * i + 1.0, now - 5.0, "{}") for i in range(480)]  # 1/min
    sim += [Incoming("sim:t:final", "sim", "telemetry", 28800.0, now - 4.0, "{}"),
            Incoming("sim:s:0", "sim", "status", now - 3.0, now - 3.0, "{}", state="offline")]  # its agent's clock
    real = [Incoming(f"real:r:{i}", "real", "result", now - 600.0 * i - 1.0, now - 600.0 * i - 0.5, "{}")
            for i in range(10)]
    store.add_messages(sim + real)
    totals = store.fleet_totals(now, 300.0)
    assert (totals["devices"], totals["online"], totals["signed_off"]) == (3, 1, 1)
    # by the devices' clocks: sim's last simulated hour (28,800 s back to 25,200 s) and real's last hour
    assert (totals["results_device_hour"], totals["results_received_hour"], totals["results"]) == (60 + 6, 480 + 6, 490)
    rows = {r["device"]: r for r in store.fleet_page(now, 300.0)[1]}
    sim_row, real_row, quiet_row = rows["sim"], rows["real"], rows["quiet"]
    assert (sim_row["online"], sim_row["signed_off"], sim_row["last_seen_s"]) == (False, True, now - 3.0)
    assert (sim_row["reported_s"], sim_row["results_device_hour"], sim_row["results_received_hour"]) == (28800.0, 60, 480)
    assert (real_row["online"], real_row["signed_off"], real_row["reported_s"]) == (True, False, now - 1.0)
    assert (real_row["results_device_hour"], real_row["results_received_hour"]) == (6, 6)
    assert (quiet_row["online"], quiet_row["signed_off"], quiet_row["reported_s"], quiet_row["results_device_hour"]) == (
        False, False, None, 0)


def test_devices_tokens_and_duplicates(store: Store) -> None:
    a = store.add_device("a", "north")
    store.add_device("b", "south")
    assert store.device("a") == a and store.device("zz") is None
    assert store.device_by_token(a.token) == a and store.device_by_token("not-a-token") is None
    assert [d["device"] for d in store.devices()] == ["a", "b"]
    with pytest.raises(StoreError, match="'a' is already registered"):
        store.add_device("a", "north")


def test_messages_are_stored_once_and_read_back_in_order(store: Store) -> None:
    assert store.add_messages(_messages("a", range(0, 50))) == 50
    assert store.add_messages(_messages("a", range(40, 60))) == 10  # ten repeats are skipped
    assert store.add_messages(_messages("a", range(0, 3), "result")) == 3
    got = store.messages("a", "telemetry")
    assert [m["i"] for m in got] == list(range(60))
    assert [m["i"] for m in store.messages("a", "telemetry", since_s=10, until_s=20)] == list(range(10, 20))
    assert len(store.messages("a", "telemetry", limit=7)) == 7
    assert store.message_counts() == {"telemetry": 60, "result": 3}
    assert len(store.latencies_s()) == 63


def test_a_failed_batch_stores_nothing(store: Store) -> None:
    bad = [*_messages("a", range(5)), Incoming("a:x", "a", "telemetry", 1.0, 1.0, None)]  # type: ignore[arg-type]
    with pytest.raises(store.integrity_errors):
        store.add_messages(bad)
    assert store.message_counts() == {}


def test_bundles_and_assignments(store: Store, tmp_path: Path) -> None:
    big = 2**40  # versions are 64-bit
    store.add_bundle(big, "digits", "ab" * 32, tmp_path / "b.tar")
    store.add_bundle(2, "digits", "cd" * 32, tmp_path / "c.tar")
    with pytest.raises(StoreError, match="already uploaded"):
        store.add_bundle(2, "digits", "cd" * 32, tmp_path / "c.tar")
    assert [b["version"] for b in store.bundles()] == [2, big] and store.bundle(big)["model"] == "digits"
    with pytest.raises(StoreError, match="not uploaded"):
        store.assign("fleet:north", 99)
    device = store.add_device("a", "north")
    assert store.assignment(device) is None
    store.assign("fleet:north", 2)
    assert store.assignment(device) == 2
    store.assign("fleet:north", big)  # an assignment is replaced, not added
    store.assign("device:a", 2)  # the device's own wins over its fleet's
    assert store.assignment(device) == 2 and store.assignments() == {"device:a": 2, "fleet:north": big}


def test_threads_write_concurrently_and_nothing_is_lost(store: Store) -> None:
    def write(k: int) -> None:
        for start in range(0, 200, 20):
            store.add_messages(_messages(f"d{k}", range(start, start + 20)))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.message_counts() == {"telemetry": 800}


def test_migrations_are_applied_once(store: Store) -> None:
    assert store.schema_version() == MIGRATIONS[-1][0]
    assert store.migrate() == []  # a restart applies nothing again


def test_an_old_sqlite_database_is_migrated_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # the schema before migrations were recorded
        db.executescript("CREATE TABLE devices (device TEXT PRIMARY KEY, fleet TEXT NOT NULL, token TEXT NOT NULL, "
                         "token_sha256 TEXT NOT NULL, created_s REAL NOT NULL);"
                         "INSERT INTO devices VALUES ('old', 'f', 't', 'h', 1.0);"
                         "CREATE TABLE messages (key TEXT PRIMARY KEY, device TEXT NOT NULL, kind TEXT NOT NULL, "
                         "ts_s REAL NOT NULL, received_s REAL NOT NULL, stored_s REAL NOT NULL, body TEXT NOT NULL);"
                         """INSERT INTO messages VALUES ('old:r:1', 'old', 'result', 1.0, 1.0, 1.0,
                            '{"correct": true, "bundle_version": 3}');"""
                         """INSERT INTO messages VALUES ('old:s:1', 'old', 'status', 1.0, 1.0, 1.0,
                            '{"state": "offline", "bundle_version": 3}');""")
    store = open_store(path)
    assert store.schema_version() == MIGRATIONS[-1][0] and store.device("old") is not None
    # what the dashboard aggregates is filled in for the messages stored before its columns
    totals = store.fleet_totals(now_s=2.0, online_s=300.0)
    assert totals["labelled"] == 1 and totals["correct"] == 1 and totals["online"] == 0
    assert store.fleet_page(2.0, 300.0)[1][0]["running_version"] == 3


@needs_postgres
def test_an_unreachable_database_is_one_line_without_the_password(tmp_path: Path) -> None:
    from server.ports import free_port

    url = f"postgresql://trickle:s3cret@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(StoreError, match="cannot connect") as err:
        open_store(url)
    assert "s3cret" not in str(err.value) and "***" in str(err.value)
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact("postgresql://h/db?user=u&password=pw") == "postgresql://h/db?user=u&password=***"


@needs_postgres
def test_a_lost_connection_fails_one_call_and_the_next_reconnects(postgres_url: str) -> None:
    """The bridge retries a failed commit (server.mqtt.bridge.STORE_ERRORS); the retry must find a live connection."""
    import psycopg

    store = open_store(fresh_database(postgres_url, "reconnect"))
    store.add_device("a", "f")
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'reconnect'")
    with pytest.raises(psycopg.OperationalError):
        store.devices()
    assert [d["device"] for d in store.devices()] == ["a"]


def test_jobs_claim_is_exclusive_and_finishing_is_all_or_nothing(store: Store, tmp_path: Path) -> None:
    first, second = store.add_job("distill", "{}"), store.add_job("distill", "{}")
    assert store.claim_job("w1")["id"] == first and store.claim_job("w2")["id"] == second
    assert store.claim_job("w3") is None
    target = tmp_path / "v1.tar"

    def crash() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):  # the bundle's file could not be placed: nothing is registered
        store.finish_job(first, "w1", {"ok": 1}, (1, "m", "00", target), "fleet:f", place=crash)
    assert store.bundles() == [] and store.assignments() == {} and store.job(first)["state"] == "running"
    with pytest.raises(JobNotFinishedError, match="no longer run by"):
        store.finish_job(first, "w2", {}, (1, "m", "00", target), None)
    assert store.cancel_job(first) == "running" and store.job_heartbeat(first, "w1") == "cancel"
    with pytest.raises(JobNotFinishedError):  # a cancellation that landed during the export wins: nothing registered
        store.finish_job(first, "w1", {"ok": 1}, (1, "m", "00", target), "fleet:f")
    assert store.bundles() == [] and store.job(first)["state"] == "running"
    store._run("UPDATE jobs SET cancel_requested = 0 WHERE id = ?", (first,))
    store.finish_job(first, "w1", {"ok": 1}, (1, "m", "00", target), "fleet:f")
    assert store.job(first)["state"] == "done" and store.assignments() == {"fleet:f": 1}
    with pytest.raises(VersionTakenError):
        store.finish_job(second, "w2", {}, (1, "m", "00", target), None)
    assert store.job(second)["state"] == "running"
    ((_, _, seen), *_) = [j for j in store.running_jobs() if j[0] == second]
    assert store.job_heartbeat(second, "w2") == "running"  # it beat after the server looked: alive after all
    assert store.requeue_job(second, "w2", seen, 2, "worker w2 died") is None
    ((_, _, seen),) = [j for j in store.running_jobs() if j[0] == second]
    assert store.requeue_job(second, "w2", seen, 2, "worker w2 died") == "queued"
    assert store.job_heartbeat(second, "w2") == "lost"
    assert store.claim_job("w4")["attempts"] == 2
    ((_, _, seen),) = store.running_jobs()
    assert store.requeue_job(second, "w4", seen, 2, "worker w4 died") == "failed"
    assert store.job(second)["error"] == "worker w4 died"


def test_cancelling_a_job_in_each_state(store: Store) -> None:
    queued, running, ended = (store.add_job("distill", "{}") for _ in range(3))
    assert store.claim_job("w")["id"] == queued
    store.claim_job("w"), store.claim_job("w")
    store.end_job(ended, "w", "failed", "boom")
    store._run("UPDATE jobs SET state = 'queued', worker = NULL WHERE id = ?", (queued,))
    assert store.cancel_job(queued) == "cancelled" and store.job(queued)["state"] == "cancelled"
    assert store.cancel_job(running) == "running" and store.job(running)["cancel_requested"]
    assert store.cancel_job(ended) == "failed" and not store.job(ended)["cancel_requested"]
    assert store.cancel_job(10_000) is None


def test_llm_api_keys_are_kept_hashed_revocable_and_count_their_use(store: Store, tmp_path: Path) -> None:
    key = store.add_llm_key("alice")
    assert key.startswith("sk-trickle-") and store.llm_key_name(key) == "alice" and store.llm_key_name(key + "x") is None
    with pytest.raises(StoreError, match="exists"):
        store.add_llm_key("alice")
    with pytest.raises(StoreError, match="letters"):
        store.add_llm_key("no spaces")
    store.record_llm_use("alice", 12, 30)
    store.record_llm_use("alice", 3, 4)
    [row] = store.llm_keys()
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (2, 15, 34) and "key" not in row
    assert store.revoke_llm_key("alice") and not store.revoke_llm_key("alice") and store.llm_key_name(key) is None
    if isinstance(store, Store) and not isinstance(store, PostgresStore):  # the key itself is nowhere in the file
        store.close()
        assert b"alice" in b"".join(f.read_bytes() for f in tmp_path.glob("db.sqlite*"))
        assert key.encode() not in b"".join(f.read_bytes() for f in tmp_path.glob("db.sqlite*"))


def test_the_store_rotates_and_revokes_a_token(store: Store) -> None:
    old = store.add_device("a", "north")
    store.add_device("b", "north")
    new = store.rotate_token("a")
    assert new is not None and (new.device, new.fleet) == ("a", "north") and new.token != old.token
    assert store.device_by_token(old.token) is None and store.device_by_token(new.token) == new == store.device("a")
    revoked = store.revoke_token("a")
    assert revoked is not None and store.device_by_token(new.token) is None
    assert revoked.token.startswith("revoked:") and store.device_by_token(revoked.token) == revoked  # nobody was shown it
    assert [(d["device"], d["revoked"]) for d in store.devices()] == [("a", True), ("b", False)]
    again = store.rotate_token("a")
    assert again is not None and store.device_by_token(again.token) == again and not store.devices()[0]["revoked"]
    assert store.rotate_token("zz") is None and store.revoke_token("zz") is None
