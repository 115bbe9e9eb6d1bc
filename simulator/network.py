"""The gateway: path loss, random loss and LoRa collisions, resolved after the nodes ran.

Nodes are simulated independently (so a fleet shards across processes); each one logs
its transmissions as rows of a ``PacketLog``. ``resolve`` takes the concatenated logs
and decides every packet's fate. Its randomness is keyed by packet identity
(seed, node_id, start_s), so the result does not depend on how the logs were ordered.

    log = PacketLog.concatenate(per_node_logs)
    result = resolve(log, NetworkConfig(), seed=0)
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import IntEnum
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from edge.core.config import Config
from edge.core.errors import ConfigError, DataError
from simulator.devices import (
    BLE_SENSITIVITY_DBM,
    LORA_BANDWIDTHS_HZ,
    LORA_SENSITIVITY_DBM,
    RADIOS,
    RadioProfile,
    ble_adv_airtime_s,
    lora_airtime_s,
)
from simulator.radio import path_loss_db

BLE_ADV_CHANNELS = 3

_DISTANCE_STREAM = 0x7D15  # separates node-distance draws from every other use of the seed
_SHADOW_STREAM_A, _SHADOW_STREAM_B, _LOSS_STREAM = 1, 2, 3


class RadioParams(Config):
    """Your own radio's figures (``[network.radio_params]``), replacing the named profile's
    (``simulator.devices.RADIOS``); the link layer (LoRa or BLE airtime, sensitivity) stays."""

    name: str | None = None
    vdd_v: float | None = Field(None, gt=0, le=50)
    tx_a: float | None = Field(None, gt=0, le=5)
    """Current while transmitting (A)."""
    rx_a: float | None = Field(None, gt=0, le=5)
    sleep_a: float | None = Field(None, ge=0, le=1)
    startup_s: float | None = Field(None, ge=0, le=10)
    """Sleep to the first transmitted bit, charged at tx_a (s)."""
    source: str = "the scenario file"


class NetworkConfig(Config):
    """The radio link and the gateway every node of a fleet shares."""

    radio: Literal["lora", "ble"] = "lora"
    """Link layer; "ble" means legacy advertising on the three advertising channels."""
    radio_params: RadioParams | None = None
    """Your own radio: these fields replace the named profile's."""
    spreading_factor: int = Field(7, ge=7, le=12)
    """LoRa spreading factor used by every node."""
    bandwidth_hz: float = Field(125e3, gt=0.0, le=500e3)
    """LoRa bandwidth; one of the SX1276 settings."""
    channels: int = Field(8, ge=1, le=64)
    """LoRa uplink channels; a node picks one uniformly per packet."""
    tx_power_dbm: float = Field(14.0, ge=-20.0, le=30.0)
    """Radiated power of every node."""
    frequency_hz: float = Field(868e6, gt=0.0)
    """Carrier frequency for path loss."""
    path_loss_exponent: float = Field(2.7, ge=1.6, le=6.0)
    """Log-distance exponent beyond the 1 m reference (2 = free space)."""
    shadowing_sigma_db: float = Field(0.0, ge=0.0, le=20.0)
    """Standard deviation of per-packet log-normal shadowing."""
    capture_threshold_db: float = Field(6.0, ge=0.0, le=30.0)
    """A packet survives a collision only when this much stronger than every overlapping one."""
    loss_probability: float = Field(0.0, ge=0.0, lt=1.0)
    """Independent random loss of an otherwise deliverable packet."""
    backhaul_latency_s: float = Field(0.05, ge=0.0)
    """Gateway to server delay added to the end of airtime."""
    payload_bytes: int = Field(16, ge=1, le=255)
    """Application payload per packet (BLE: advertising data, at most 31)."""
    min_distance_m: float = Field(10.0, gt=0.0)
    """Inner radius of the annulus node distances are drawn from."""
    max_distance_m: float = Field(2000.0, gt=0.0)
    """Outer radius of that annulus."""

    @field_validator("bandwidth_hz")
    @classmethod
    def _sx1276_bandwidth(cls, value: float) -> float:
        if value not in LORA_BANDWIDTHS_HZ:
            raise ValueError(f"bandwidth_hz = {value!r}: one of {LORA_BANDWIDTHS_HZ}")
        return value

    @model_validator(mode="after")
    def _annulus(self) -> NetworkConfig:
        if self.min_distance_m >= self.max_distance_m:
            raise ValueError(
                f"min_distance_m = {self.min_distance_m!r}: must be < max_distance_m ({self.max_distance_m!r})"
            )
        return self

    def channel_count(self) -> int:
        return BLE_ADV_CHANNELS if self.radio == "ble" else self.channels

    @property
    def radio_profile(self) -> RadioProfile:
        """The radio's power figures: the named profile, with ``radio_params`` in place of its own."""
        base = RADIOS[self.radio]
        if self.radio_params is None:
            return base
        given = self.radio_params.model_dump(exclude_none=True)
        return replace(base, **{**given, "name": given.get("name", f"{base.name} (customised)")})


def packet_airtime_s(cfg: NetworkConfig) -> float:
    if cfg.radio == "ble":
        return ble_adv_airtime_s(cfg.payload_bytes)
    return lora_airtime_s(cfg.payload_bytes, sf=cfg.spreading_factor, bandwidth_hz=cfg.bandwidth_hz)


def received_power_dbm(
    tx_power_dbm: float, distance_m: object, frequency_hz: float, exponent: float
) -> np.ndarray:
    """At the gateway, with isotropic antennas: the path-loss model of ``simulator.radio``."""
    return tx_power_dbm - path_loss_db(distance_m, frequency_hz, exponent)


def node_distances_m(cfg: NetworkConfig, n_nodes: int, seed: int) -> np.ndarray:
    """Distance of each node from the gateway, uniform over the annulus area.

    Node i's draw depends only on (seed, i), so node 7 sits at the same place in a
    fleet of 10 and in a fleet of 10 000.
    """
    if n_nodes < 0:
        raise ConfigError("n_nodes", n_nodes, "must be >= 0")
    if seed < 0:
        raise ConfigError("seed", seed, "must be >= 0")
    u = np.array([np.random.default_rng([seed, i, _DISTANCE_STREAM]).random() for i in range(n_nodes)])
    r0_sq, r1_sq = cfg.min_distance_m**2, cfg.max_distance_m**2
    return np.sqrt(r0_sq + u * (r1_sq - r0_sq))  # inverse CDF of r for uniform density in the plane


@dataclass
class PacketLog:
    """Every transmission of one or more nodes, one row per packet (columns of equal length)."""

    node_id: np.ndarray  # (n,) int64
    start_s: np.ndarray  # (n,) float64, first bit on air
    airtime_s: np.ndarray  # (n,) float64, > 0
    channel: np.ndarray  # (n,) int16
    sf: np.ndarray  # (n,) int8, LoRa spreading factor (ignored for BLE)
    rx_power_dbm: np.ndarray  # (n,) float64, at the gateway before shadowing
    deadline_s: np.ndarray  # (n,) float64, absolute deadline of the carried result; inf if none

    _DTYPES: ClassVar[dict[str, type]] = {
        "node_id": np.int64, "start_s": np.float64, "airtime_s": np.float64, "channel": np.int16,
        "sf": np.int8, "rx_power_dbm": np.float64, "deadline_s": np.float64,
    }

    def __post_init__(self) -> None:
        for name, dtype in self._DTYPES.items():
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=dtype))
        lengths = {name: getattr(self, name).shape for name in self._DTYPES}
        if len(set(lengths.values())) != 1 or len(lengths["node_id"]) != 1:
            raise DataError(f"PacketLog columns must be 1-D and equal length, got shapes {lengths}")
        if not np.all(np.isfinite(self.start_s)) or not np.all(self.airtime_s > 0):
            raise DataError("PacketLog needs finite start_s and airtime_s > 0 in every row")

    def __len__(self) -> int:
        return len(self.node_id)

    @staticmethod
    def empty() -> PacketLog:
        return PacketLog(*(np.empty(0) for _ in PacketLog._DTYPES))

    @staticmethod
    def concatenate(logs: list[PacketLog]) -> PacketLog:
        logs = list(logs)
        if not logs:
            return PacketLog.empty()
        return PacketLog(*(np.concatenate([getattr(log, f.name) for log in logs]) for f in fields(PacketLog)))

    def take(self, index: np.ndarray) -> PacketLog:
        return PacketLog(*(getattr(self, f.name)[index] for f in fields(PacketLog)))


class Outcome(IntEnum):
    """What became of a packet: delivered, collided, below the gateway's sensitivity, or lost."""

    DELIVERED = 0
    COLLIDED = 1
    BELOW_SENSITIVITY = 2
    LOST = 3


@dataclass(frozen=True)
class Resolution:
    """Fate of every packet (in the log's row order) and per-node totals."""

    outcome: np.ndarray  # (n,) int8, Outcome codes
    arrival_s: np.ndarray  # (n,) float64, end of airtime + backhaul; nan unless delivered
    rx_power_dbm: np.ndarray  # (n,) float64, after shadowing
    node_id: np.ndarray  # (m,) int64, distinct nodes, ascending
    delivered: np.ndarray  # (m,) int64
    collided: np.ndarray  # (m,) int64
    lost: np.ndarray  # (m,) int64
    below_sensitivity: np.ndarray  # (m,) int64
    delivered_in_time: np.ndarray  # (m,) int64, arrival <= deadline


def resolve(log: PacketLog, cfg: NetworkConfig, seed: int) -> Resolution:
    """Decide every packet: below sensitivity, else collided, else randomly lost, else delivered.

    Every packet on air interferes, heard or not: a packet too weak to decode still
    takes power from the channel.
    """
    # Rows tied on (start_s, node_id) draw the same randomness and overlap each other, so
    # their order cannot change any result.
    order = np.lexsort((log.node_id, log.start_s))
    s = log.take(order)
    end_s = s.start_s + s.airtime_s
    rx_dbm = s.rx_power_dbm + _shadowing_db(s, cfg.shadowing_sigma_db, seed)
    audible = rx_dbm >= _sensitivity_dbm(s, cfg)
    collided = _collided(s.start_s, end_s, _group_key(s), rx_dbm, cfg.capture_threshold_db)
    lost = _packet_uniform(s, seed, _LOSS_STREAM) < cfg.loss_probability
    fates = [Outcome.BELOW_SENSITIVITY, Outcome.COLLIDED, Outcome.LOST]
    outcome = np.select([~audible, collided, lost], fates, Outcome.DELIVERED).astype(np.int8)
    arrival_s = np.where(outcome == Outcome.DELIVERED, end_s + cfg.backhaul_latency_s, np.nan)
    return _per_node(log, *_unsort(order, outcome, arrival_s, rx_dbm))


def _unsort(order: np.ndarray, *sorted_columns: np.ndarray) -> list[np.ndarray]:
    out = []
    for column in sorted_columns:
        back = np.empty_like(column)
        back[order] = column
        out.append(back)
    return out


def _per_node(log: PacketLog, outcome: np.ndarray, arrival_s: np.ndarray, rx_dbm: np.ndarray) -> Resolution:
    node_ids, row_node = np.unique(log.node_id, return_inverse=True)

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(row_node[mask], minlength=len(node_ids)).astype(np.int64)

    in_time = (outcome == Outcome.DELIVERED) & (arrival_s <= log.deadline_s)
    return Resolution(
        outcome=outcome, arrival_s=arrival_s, rx_power_dbm=rx_dbm, node_id=node_ids,
        delivered=count(outcome == Outcome.DELIVERED), collided=count(outcome == Outcome.COLLIDED),
        lost=count(outcome == Outcome.LOST), below_sensitivity=count(outcome == Outcome.BELOW_SENSITIVITY),
        delivered_in_time=count(in_time),
    )


def _sensitivity_dbm(log: PacketLog, cfg: NetworkConfig) -> np.ndarray | float:
    if cfg.radio == "ble":
        return BLE_SENSITIVITY_DBM
    table = np.full(13, np.nan)
    for sf, dbm in LORA_SENSITIVITY_DBM.items():
        table[sf] = dbm
    unknown = (log.sf < 7) | (log.sf > 12)
    if unknown.any():
        bad = sorted(set(log.sf[unknown].tolist()))
        raise DataError(f"PacketLog holds spreading factors {bad}; LoRa sensitivity is known for 7..12")
    # The noise floor (-174 dBm/Hz + 10 log10 B + NF) moves the table, quoted at 125 kHz, with bandwidth.
    return table[log.sf] + 10.0 * np.log10(cfg.bandwidth_hz / 125e3)


def _shadowing_db(log: PacketLog, sigma_db: float, seed: int) -> np.ndarray:
    if sigma_db == 0.0:
        return np.zeros(len(log))
    u1 = _packet_uniform(log, seed, _SHADOW_STREAM_A)
    u2 = _packet_uniform(log, seed, _SHADOW_STREAM_B)
    return sigma_db * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)  # Box-Muller


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Steele, Lea & Flood, "Fast splittable pseudorandom number generators" (2014): the finaliser."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _packet_uniform(log: PacketLog, seed: int, stream: int) -> np.ndarray:
    """U(0, 1) per packet, a hash of (seed, stream, node_id, start_s): independent of row order."""
    key = np.uint64((seed ^ (stream << 48)) & 0xFFFF_FFFF_FFFF_FFFF)
    h = _splitmix64(np.full(len(log), key, dtype=np.uint64))
    h = _splitmix64(h ^ log.node_id.view(np.uint64))
    h = _splitmix64(h ^ (log.start_s + 0.0).view(np.uint64))  # + 0.0 folds -0.0 into 0.0
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _group_key(log: PacketLog) -> np.ndarray:
    """Packets interfere only on the same channel and SF (LoRa SFs are quasi-orthogonal)."""
    return log.channel.astype(np.int64) * 256 + log.sf.astype(np.int64)


def _collided(
    start_s: np.ndarray, end_s: np.ndarray, key: np.ndarray, rx_dbm: np.ndarray, capture_db: float
) -> np.ndarray:
    """True where some overlapping packet in the same group is within ``capture_db`` of this one.

    Rows come sorted by start, so a stable sort on the group key keeps each group in start order.
    """
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    strongest_other = np.full(len(order), -np.inf)
    for rows in np.split(order, bounds):
        strongest_other[rows] = _strongest_overlapping(start_s[rows], end_s[rows], rx_dbm[rows])
    return rx_dbm - strongest_other < capture_db


def _strongest_overlapping(start_s: np.ndarray, end_s: np.ndarray, rx_dbm: np.ndarray) -> np.ndarray:
    """Per packet (sorted by start), the strongest other packet overlapping it; -inf if none.

    Packet i overlaps exactly the packets i+1 .. hi[i]-1 that start before it ends, and
    every earlier packet j whose own range reaches past i. The first is a range-max
    query, the second a range-max update; a sparse table answers each in O(n log n).
    """
    idx = np.arange(len(start_s))
    hi = np.searchsorted(start_s, end_s, side="left")  # first packet starting at or after my end
    later = _range_max(rx_dbm, idx + 1, hi)
    earlier = _range_chmax(len(start_s), idx + 1, hi, rx_dbm)
    return np.maximum(later, earlier)


def _floor_log2(n: np.ndarray) -> np.ndarray:
    return np.floor(np.log2(n)).astype(np.int64)


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[q]:hi[q]]) per query q, -inf where the range is empty."""
    out = np.full(len(lo), -np.inf)
    live = hi > lo
    if not live.any():
        return out
    level = np.full(len(lo), -1)
    level[live] = _floor_log2(hi[live] - lo[live])
    table = values  # table[i] = max(values[i : i + 2**k]) at level k
    for k in range(level.max() + 1):
        if k > 0:
            half = 1 << (k - 1)
            table = np.maximum(table[:-half], table[half:])
        q = level == k
        out[q] = np.maximum(table[lo[q]], table[hi[q] - (1 << k)])
    return out


def _range_chmax(n: int, lo: np.ndarray, hi: np.ndarray, values: np.ndarray) -> np.ndarray:
    """out[i] = max(values[q] for every q with lo[q] <= i < hi[q]), -inf where none covers i."""
    live = hi > lo
    lo, hi, values = lo[live], hi[live], values[live]
    if len(lo) == 0:
        return np.full(n, -np.inf)
    level = _floor_log2(hi - lo)
    tables = [np.full(n - (1 << k) + 1, -np.inf) for k in range(level.max() + 1)]
    for k, table in enumerate(tables):  # each range is covered by two blocks of 2**k
        q = level == k
        np.maximum.at(table, lo[q], values[q])
        np.maximum.at(table, hi[q] - (1 << k), values[q])
    for k in range(len(tables) - 1, 0, -1):  # push each block down to its two halves
        half, parent = 1 << (k - 1), tables[k]
        child = tables[k - 1]
        child[: len(parent)] = np.maximum(child[: len(parent)], parent)
        child[half : half + len(parent)] = np.maximum(child[half : half + len(parent)], parent)
    return tables[0]
