"""Property-based fuzzing of the HTTP API against its own OpenAPI spec: no input gets a 5xx."""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings

from server.api.app import create_app
from server.api.state import ServerState
from server.mqtt.bridge import Metrics
from server.store.store import Store

ADMIN = "fuzz-admin-token"


def test_no_request_gets_a_server_error(tmp_path: Path) -> None:
    # schemathesis' pytest plugin does not load on this pytest; its strategies drive hypothesis directly
    store = Store(tmp_path / "db.sqlite")
    store.add_device("known", "f")
    app = create_app(ServerState(store, ADMIN, tmp_path / "bundles", [], Metrics()))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case: schemathesis.Case) -> None:
            for headers in ({"Authorization": f"Bearer {ADMIN}"}, {}):  # as the admin, and with no token
                response = case.call(headers=headers)
                not_ready = case.formatted_path == "/readyz" and response.status_code == 503  # no broker here: its answer
                assert response.status_code < 500 or not_ready, (
                    f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}")

        fuzz()


def test_the_spec_lists_every_protocol_route(tmp_path: Path) -> None:
    from edge.contract.protocol import ROUTES

    app = create_app(ServerState(Store(tmp_path / "db.sqlite"), ADMIN, tmp_path / "bundles", [], Metrics()))
    assert set(ROUTES.values()) <= set(app.openapi()["paths"])
