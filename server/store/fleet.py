"""What the dashboard aggregates over devices and messages: totals, results over the devices' own
time, one page of devices in natural order."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from server.store.messages import Messages

VIRTUAL_BEFORE_S = 1e9  # a device time before 2001-09-09 counts from the device's own start (a simulation)
ROUND_BINS_S = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 10800.0,
                21600.0, 43200.0, 86400.0, 2 * 86400.0, 7 * 86400.0, 14 * 86400.0, 30 * 86400.0)

def natural_key(name: str) -> tuple[list[str | int], str]:
    """Sort key that reads numbers as numbers: n2 before n10 (then by the name itself)."""
    return [int(part) if k % 2 else part.lower() for k, part in enumerate(re.split(r"(\d+)", name))], name


class FleetQueries(Messages):
    """The dashboard's read-only aggregates."""

    def fleet_totals(self, now_s: float, online_s: float) -> dict[str, Any]:
        """Devices: how many are online (a message received within ``online_s`` of ``now_s``, by the
        server's clock, and no later offline status) and how many signed off (their last status is
        offline); results: all, within the last hour of the devices' own clocks (``results_device_hour``,
        see ``device_clocks``) and received within the last hour of the server's (``results_received_hour``);
        verdicts known and right; messages per kind."""
        devices, online, signed_off = self._one(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN heard_s >= ? AND status <> 'offline' THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(CASE WHEN status = 'offline' THEN 1 ELSE 0 END), 0) FROM ("
            "SELECT (SELECT MAX(received_s) FROM messages m WHERE m.device = d.device) AS heard_s, "
            "COALESCE((SELECT state FROM messages s WHERE s.device = d.device AND s.kind = 'status' "
            "ORDER BY s.received_s DESC, s.key DESC LIMIT 1), '') AS status FROM devices d) seen",
            (now_s - online_s,))
        results, hour, labelled, right = self._one(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN received_s >= ? THEN 1 ELSE 0 END), 0), COUNT(correct), "
            "COALESCE(SUM(correct), 0) FROM messages WHERE kind = 'result'", (now_s - 3600.0,))
        device_hour = sum(count for _, count in self.device_clocks(now_s).values())
        return {"devices": int(devices), "online": int(online), "signed_off": int(signed_off), "results": int(results),
                "results_device_hour": device_hour, "results_received_hour": int(hour), "labelled": int(labelled),
                "correct": int(right), "messages": self.message_counts()}

    def device_clocks(self, now_s: float, devices: list[str] | None = None) -> dict[str, tuple[float, int]]:
        """Per device that reported (of ``devices``, or all): its clock's newest reading (its newest
        result or telemetry ``ts_s``; a status carries the agent's wall clock) and its results within the
        hour up to its clock's now: a real clock's now is ``now_s``, a virtual clock's (before
        ``VIRTUAL_BEFORE_S``: a simulation's seconds since its start) its newest reading."""
        only = "" if devices is None else f"WHERE d.device IN ({', '.join('?' * len(devices))})"
        # index seeks on (device, kind, ts_s) per device: newest result, newest telemetry, the hour's count
        rows = self._all(
            "SELECT c.device, c.newest, (SELECT COUNT(*) FROM messages r WHERE r.device = c.device AND r.kind = 'result' "
            "AND r.ts_s > (CASE WHEN c.newest < ? THEN c.newest ELSE ? END) - 3600.0) FROM ("
            "SELECT k.device, CASE WHEN k.rn IS NULL THEN k.tn WHEN k.tn IS NULL OR k.rn > k.tn THEN k.rn ELSE k.tn END "
            "AS newest FROM (SELECT d.device, "
            "(SELECT MAX(ts_s) FROM messages m WHERE m.device = d.device AND m.kind = 'result') AS rn, "
            "(SELECT MAX(ts_s) FROM messages m WHERE m.device = d.device AND m.kind = 'telemetry') AS tn "
            f"FROM devices d {only}) k) c WHERE c.newest IS NOT NULL",
            (VIRTUAL_BEFORE_S, now_s, *(devices or [])))
        return {device: (float(newest), int(count)) for device, newest, count in rows}

    def results_over_time(self, now_s: float, bins: int = 48) -> list[dict[str, Any]]:
        """Results counted by the time the device gave them (``ts_s``), not when they arrived: one
        series per clock that has any. ``virtual``: a simulation's (or a device without a real-time
        clock's) own seconds since its start, any ``ts_s`` before ``VIRTUAL_BEFORE_S``; its bins
        cover the whole span seen, about ``bins`` of a round size. ``wall``: the last 24 h in hours
        (whole hours, ending with the current one). Each is ``{clock, start_s, bin_s, counts}``."""
        out = []
        lo, hi, n = self._one("SELECT MIN(ts_s), MAX(ts_s), COUNT(*) FROM messages WHERE kind = 'result' AND ts_s < ?",
                              (VIRTUAL_BEFORE_S,))
        if n:
            lo = min(lo, 0.0)  # a virtual clock's axis starts at its start
            bin_s = next((b for b in ROUND_BINS_S if b * bins >= hi - lo), ROUND_BINS_S[-1])
            start = math.floor(lo / bin_s) * bin_s
            out.append({"clock": "virtual", "start_s": start, "bin_s": bin_s,
                        "counts": self._binned(start, bin_s, int((hi - start) // bin_s) + 1)})
        end = math.ceil(now_s / 3600.0) * 3600.0
        counts = self._binned(end - 24 * 3600.0, 3600.0, 24)
        if any(counts):
            out.append({"clock": "wall", "start_s": end - 24 * 3600.0, "bin_s": 3600.0, "counts": counts})
        return out

    def _binned(self, start_s: float, bin_s: float, n: int) -> list[int]:
        """Results with ``start_s <= ts_s < start_s + n * bin_s``, counted per bin."""
        bucket = "FLOOR((ts_s - ?) / ?)" if self.dialect == "postgresql" else "CAST((ts_s - ?) / ? AS INTEGER)"
        counts = [0] * n
        for k, count in self._all(f"SELECT {bucket} AS k, COUNT(*) FROM messages WHERE kind = 'result' AND ts_s >= ? "
                                  "AND ts_s < ? GROUP BY k", (start_s, bin_s, start_s, start_s + n * bin_s)):
            if 0 <= int(k) < n:
                counts[int(k)] += int(count)
        return counts

    def fleet_page(self, now_s: float, online_s: float, offset: int = 0, limit: int = 50, search: str = "",
                   only: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """(devices matching, one page of them in natural order: n2 before n10): per device its
        fleet; by the server's clock when it was last heard from (``last_seen_s``, the newest message
        received), online (heard within ``online_s``, its last status not offline) and whether it
        signed off (that status offline); by its own clock its newest report (``reported_s``) and its
        results within the hour up to it (``device_clocks``); the bundle it reports running, results
        (all, and received within the server's last hour), verdicts known and right, its last event,
        and from its newest telemetry (by the device's time) its power failures and time powered."""
        pattern = "%" + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where = "WHERE (LOWER(device) LIKE ? ESCAPE '\\' OR LOWER(fleet) LIKE ? ESCAPE '\\')"
        args: list[Any] = [pattern, pattern]
        if only is not None:
            where, args = where + " AND device = ?", [*args, only]
        names = sorted((name for (name,) in self._all(f"SELECT device FROM devices {where}", args)), key=natural_key)
        chosen = names[offset : offset + limit]
        if not chosen:
            return len(names), []
        rows = self._all(
            "SELECT d.device, d.fleet, MAX(m.received_s), "
            "COALESCE(SUM(CASE WHEN m.kind = 'result' THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(CASE WHEN m.kind = 'result' AND m.received_s >= ? THEN 1 ELSE 0 END), 0), "
            "COUNT(m.correct), COALESCE(SUM(m.correct), 0), "
            "(SELECT b.bundle_version FROM messages b WHERE b.device = d.device AND b.bundle_version IS NOT NULL "
            " ORDER BY b.ts_s DESC, b.key DESC LIMIT 1), "
            "(SELECT s.state FROM messages s WHERE s.device = d.device AND s.kind = 'status' "
            " ORDER BY s.received_s DESC, s.key DESC LIMIT 1), "
            "(SELECT e.state FROM messages e WHERE e.device = d.device AND e.kind = 'event' "
            " ORDER BY e.ts_s DESC, e.key DESC LIMIT 1), "
            "(SELECT t.body FROM messages t WHERE t.device = d.device AND t.kind = 'telemetry' "
            " ORDER BY t.ts_s DESC, t.key DESC LIMIT 1) "
            f"FROM (SELECT device, fleet FROM devices WHERE device IN ({', '.join('?' * len(chosen))})) d "
            "LEFT JOIN messages m ON m.device = d.device GROUP BY d.device, d.fleet",
            (now_s - 3600.0, *chosen))
        clocks = self.device_clocks(now_s, chosen)
        page = []
        for device, fleet, seen, results, hour, labelled, right, running, status, event, telemetry in rows:
            online = seen is not None and seen >= now_s - online_s and status != "offline"
            last = json.loads(telemetry) if telemetry else {}
            reported, device_hour = clocks.get(device, (None, 0))
            page.append({"device": device, "fleet": fleet, "last_seen_s": seen, "online": bool(online),
                         "signed_off": status == "offline", "reported_s": reported, "running_version": running,
                         "results": int(results), "results_device_hour": device_hour,
                         "results_received_hour": int(hour), "labelled": int(labelled), "correct": int(right),
                         "last_event": event, "power_cycles": last.get("power_cycles"), "on_time_s": last.get("on_time_s")})
        order = {name: k for k, name in enumerate(chosen)}
        return len(names), sorted(page, key=lambda row: order[row["device"]])
