"""The device registry: names, fleets and tokens (only their sha256 is looked up)."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from server.store.database import Database, StoreError

RESERVED_USER = "trickle-server"  # the bridge's MQTT user (server.mqtt.bridge.SERVER_USER)


@dataclass(frozen=True)
class Device:
    """A registered device: its name, fleet and token."""

    device: str
    fleet: str
    token: str


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Devices(Database):
    """Registering devices and finding them by name or token."""

    def add_device(self, device: str, fleet: str) -> Device:
        if device == RESERVED_USER:
            raise StoreError(f"device {device!r}: the name is the server's own MQTT user")
        token = secrets.token_urlsafe(32)
        try:
            self._run("INSERT INTO devices VALUES (?, ?, ?, ?, ?)", (device, fleet, token, token_sha256(token), time.time()))
        except self.integrity_errors:
            raise StoreError(f"device {device!r} is already registered") from None
        return Device(device, fleet, token)

    def device(self, device: str) -> Device | None:
        row = self._one("SELECT device, fleet, token FROM devices WHERE device = ?", (device,))
        return Device(*row) if row else None

    def device_by_token(self, token: str) -> Device | None:
        row = self._one("SELECT device, fleet, token FROM devices WHERE token_sha256 = ?", (token_sha256(token),))
        return Device(*row) if row else None

    def devices(self) -> list[dict[str, Any]]:
        rows = self._all("SELECT device, fleet, created_s FROM devices ORDER BY device")
        return [{"device": d, "fleet": f, "created_s": c} for d, f, c in rows]
