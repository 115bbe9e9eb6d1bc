"""The device registry: names, fleets and tokens (only their sha256 is looked up).

A token is rotated (a new one, shown once) or revoked by replacing it: a revoked device's token
becomes one nobody was shown, marked ``revoked:``, so every check that compares tokens (HTTP auth,
the embedded broker, Mosquitto's password file, the bridge's HMAC keys) refuses the old one without
having to know about revocation, and nothing can match the device until the admin rotates again."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from server.store.database import Database, StoreError

RESERVED_USER = "trickle-server"  # the bridge's MQTT user (server.mqtt.bridge.SERVER_USER)
REVOKED = "revoked:"  # the mark of a revoked device's unknown token (issued tokens are URL-safe base64: no ':')


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
        rows = self._all("SELECT device, fleet, created_s, token FROM devices ORDER BY device")
        return [{"device": d, "fleet": f, "created_s": c, "revoked": t.startswith(REVOKED)} for d, f, c, t in rows]

    def rotate_token(self, device: str) -> Device | None:
        """A new token for ``device`` (to show once); the old one stops matching at once. None: no
        such device."""
        return self._replace_token(device, secrets.token_urlsafe(32))

    def revoke_token(self, device: str) -> Device | None:
        """Replace ``device``'s token by one nobody is shown (``rotate_token`` gives it a usable one
        again). None: no such device."""
        return self._replace_token(device, REVOKED + secrets.token_urlsafe(32))

    def _replace_token(self, device: str, token: str) -> Device | None:
        cursor = self._run("UPDATE devices SET token = ?, token_sha256 = ? WHERE device = ?",
                           (token, token_sha256(token), device))
        if not cursor.rowcount:
            return None
        record = self.device(device)
        assert record is not None  # devices are never deleted
        return Device(record.device, record.fleet, token)
