"""The bundle registry and the assignments of a version to a device or a fleet."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from server.store.database import Database, StoreError
from server.store.devices import Device


class Bundles(Database):
    """Uploaded bundles and who should run which."""

    def add_bundle(self, version: int, model: str, sha256: str, path: Path) -> None:
        try:
            self._run("INSERT INTO bundles VALUES (?, ?, ?, ?, ?)", (version, model, sha256, str(path), time.time()))
        except self.integrity_errors:
            raise StoreError(f"bundle_version {version} is already uploaded; a new bundle needs a new version") from None

    def bundle(self, version: int) -> dict[str, Any] | None:
        row = self._one("SELECT version, model, sha256, path FROM bundles WHERE version = ?", (version,))
        return dict(zip(("version", "model", "sha256", "path"), row)) if row else None

    def bundles(self) -> list[dict[str, Any]]:
        rows = self._all("SELECT version, model, sha256 FROM bundles ORDER BY version")
        return [dict(zip(("version", "model", "sha256"), r)) for r in rows]

    def assign(self, target: str, version: int) -> None:
        """``target`` is ``device:ID`` or ``fleet:NAME``."""
        if self.bundle(version) is None:
            raise StoreError(f"bundle_version {version} is not uploaded")
        self._run("INSERT INTO assignments VALUES (?, ?, ?) ON CONFLICT (target) DO UPDATE SET "
                  "version = excluded.version, assigned_s = excluded.assigned_s", (target, version, time.time()))

    def assignment(self, device: Device) -> int | None:
        """The version a device should run: its own assignment, else its fleet's."""
        for target in (f"device:{device.device}", f"fleet:{device.fleet}"):
            row = self._one("SELECT version FROM assignments WHERE target = ?", (target,))
            if row:
                return int(row[0])
        return None

    def assignments(self) -> dict[str, int]:
        """Every assignment: target -> bundle version."""
        return {t: int(v) for t, v in self._all("SELECT target, version FROM assignments ORDER BY target")}
