"""Device profiles and airtime against hand computations from the cited documents."""

from __future__ import annotations

import itertools
import math

import pytest

from edge.core.errors import ConfigError
from simulator.devices import (
    LORA_SENSITIVITY_DBM,
    MCUS,
    RADIOS,
    ble_adv_airtime_s,
    lora_airtime_s,
    packet_energy_j,
)

# Semtech AN1200.13 §4:
#   T_sym = 2^SF / BW
#   n_payload = 8 + max(ceil((8 PL - 4 SF + 28 + 16 CRC - 20 IH) / (4 (SF - 2 DE))) (CR + 4), 0)
#   T = (n_preamble + 4.25 + n_payload) T_sym


def test_lora_airtime_sf7_20_bytes() -> None:
    # T_sym = 128 / 125 kHz = 1.024 ms; ceil((160 - 28 + 28 + 16 - 0) / 28) = ceil(6.29) = 7
    # n_payload = 8 + 7 * 5 = 43; T = (8 + 4.25 + 43) * 1.024 ms = 56.576 ms
    assert lora_airtime_s(20, sf=7) == pytest.approx(56.576e-3, rel=1e-12)


def test_lora_airtime_sf12_uses_low_data_rate_optimisation() -> None:
    # T_sym = 4096 / 125 kHz = 32.768 ms > 16 ms, so DE = 1: ceil((160 - 48 + 28 + 16) / 40) = 4
    # n_payload = 8 + 4 * 5 = 28; T = (8 + 4.25 + 28) * 32.768 ms = 1318.912 ms
    assert lora_airtime_s(20, sf=12) == pytest.approx(1.318912, rel=1e-12)
    assert lora_airtime_s(20, sf=12, low_data_rate_optimize=True) == lora_airtime_s(20, sf=12)
    # DE = 0 by force: ceil(156 / 48) = 4, the same count here; at 51 bytes it differs:
    # DE = 1: ceil((408 - 48 + 44) / 40) = 11 -> 63 symbols; DE = 0: ceil(404 / 48) = 9 -> 53 symbols
    assert lora_airtime_s(51, sf=12) == pytest.approx((8 + 4.25 + 63) * 32.768e-3, rel=1e-12)
    assert lora_airtime_s(51, sf=12, low_data_rate_optimize=False) == pytest.approx((8 + 4.25 + 53) * 32.768e-3)


def test_lora_airtime_sf11_switches_ldro_on_at_16_ms() -> None:
    # T_sym = 2048 / 125 kHz = 16.384 ms > 16 ms -> DE = 1 by default.
    assert lora_airtime_s(30, sf=11) == lora_airtime_s(30, sf=11, low_data_rate_optimize=True)
    # At 250 kHz T_sym = 8.192 ms -> DE = 0.
    assert lora_airtime_s(30, sf=11, bandwidth_hz=250e3) == lora_airtime_s(
        30, sf=11, bandwidth_hz=250e3, low_data_rate_optimize=False
    )


def test_lora_airtime_implicit_header_no_crc_and_cr48() -> None:
    # SF9, PL 10, implicit, no CRC: T_sym = 4.096 ms; ceil((80 - 36 + 28 - 20) / 36) = 2 -> 8 + 10 = 18
    assert lora_airtime_s(10, sf=9, explicit_header=False, crc=False) == pytest.approx(30.25 * 4.096e-3)
    # SF7, PL 20, CR 4/8: 8 + 7 * 8 = 64 symbols -> (12.25 + 64) * 1.024 ms = 78.08 ms
    assert lora_airtime_s(20, sf=7, coding_rate=4) == pytest.approx(78.08e-3)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"payload_bytes": 256}, "payload_bytes"),
        ({"payload_bytes": 10, "sf": 5}, "sf"),
        ({"payload_bytes": 10, "sf": 13}, "sf"),
        ({"payload_bytes": 10, "coding_rate": 5}, "coding_rate"),
        ({"payload_bytes": 10, "bandwidth_hz": 100e3}, "bandwidth_hz"),
        ({"payload_bytes": 10, "sf": 6}, "explicit_header"),
        ({"payload_bytes": 10, "preamble_symbols": 2}, "preamble_symbols"),
    ],
)
def test_lora_airtime_rejects_bad_arguments(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        lora_airtime_s(**kwargs)
    assert err.value.field == field
    assert field in str(err.value)


def test_lora_sf6_implicit_header_is_allowed() -> None:
    # T_sym = 0.512 ms; ceil((80 - 24 + 28 + 16 - 20) / 24) = 4 -> 8 + 20 = 28 symbols
    assert lora_airtime_s(10, sf=6, explicit_header=False) == pytest.approx((8 + 4.25 + 28) * 0.512e-3)


def test_ble_adv_airtime() -> None:
    # (1 + 4 + 2 + 6 AdvA + 31 + 3) bytes * 8 us = 47 * 8 us = 376 us, the longest legacy PDU.
    assert ble_adv_airtime_s(31) == pytest.approx(376e-6)
    assert ble_adv_airtime_s(0) == pytest.approx(16 * 8e-6)
    with pytest.raises(ConfigError, match="payload_bytes"):
        ble_adv_airtime_s(32)


def test_packet_energy_is_current_times_voltage_times_time() -> None:
    # SX1276: 29 mA at 3.3 V for 310 us start-up + 56.576 ms airtime.
    assert packet_energy_j(RADIOS["lora"], 56.576e-3) == pytest.approx(29e-3 * 3.3 * (310e-6 + 56.576e-3))
    # nRF52840: three advertising channels, each 40 us ramp-up + 376 us at 6.40 mA, 3.0 V.
    assert packet_energy_j(RADIOS["ble"], 376e-6, channels=3) == pytest.approx(3 * 6.40e-3 * 3.0 * 416e-6)
    with pytest.raises(ConfigError, match="channels"):
        packet_energy_j(RADIOS["ble"], 376e-6, channels=0)
    with pytest.raises(ConfigError, match="airtime_s"):
        packet_energy_j(RADIOS["ble"], -1.0)


def test_msp430_compute_energy_by_hand() -> None:
    mcu = MCUS["msp430fr5994"]
    # 1e6 MACs * 16 cycles = 16e6 cycles at 8 MHz = 2 s; 118 uA/MHz * 8 MHz = 0.944 mA at 3.0 V.
    assert mcu.compute_time_s(1e6) == pytest.approx(2.0)
    assert mcu.compute_energy_j(1e6) == pytest.approx(2.0 * 0.944e-3 * 3.0)
    assert mcu.sleep_power_w() == pytest.approx(0.5e-6 * 3.0)
    assert mcu.boot_energy_j() == pytest.approx(0.5e-3 * 0.944e-3 * 3.0)
    # FRAM by DMA: 1 MCLK cycle per byte = 125 ns and 118 pA*s * 3.0 V = 0.354 nJ.
    assert mcu.nvm_write_s_per_byte == pytest.approx(125e-9)
    assert mcu.nvm_write_j_per_byte == pytest.approx(0.354e-9)


def test_cortex_m4_compute_and_spi_fram_energy_by_hand() -> None:
    mcu = MCUS["cortex-m4"]
    # 1e6 MACs * 2.5 cycles at 80 MHz = 31.25 ms at 100 uA/MHz * 80 MHz = 8 mA, 3.0 V.
    assert mcu.compute_time_s(1e6) == pytest.approx(31.25e-3)
    assert mcu.compute_energy_j(1e6) == pytest.approx(31.25e-3 * 8e-3 * 3.0)
    # SPI F-RAM at 40 MHz: 8 bits = 200 ns per byte with 8 mA core + 2.5 mA FM25V10 at 3.0 V.
    assert mcu.nvm_read_s_per_byte == pytest.approx(200e-9)
    assert mcu.nvm_read_j_per_byte == pytest.approx(10.5e-3 * 3.0 * 200e-9)


def test_cortex_m33_spi_fram_energy_by_hand() -> None:
    mcu = MCUS["cortex-m33"]
    # 19.5 uA/MHz * 160 MHz = 3.12 mA core + 2.5 mA F-RAM at 3.3 V for 200 ns.
    assert mcu.nvm_write_j_per_byte == pytest.approx(5.62e-3 * 3.3 * 200e-9)
    assert mcu.active_power_w() == pytest.approx(3.12e-3 * 3.3)


def test_profiles_are_cited_and_consistent() -> None:
    assert set(MCUS) == {"msp430fr5994", "cortex-m4", "cortex-m33"}
    documents = {"msp430fr5994": "SLASE54", "cortex-m4": "DS10198", "cortex-m33": "DS13737"}
    for key, mcu in MCUS.items():
        assert documents[key] in mcu.source
        assert mcu.sleep_power_w() < mcu.active_power_w() / 100
        assert mcu.brown_out_v < mcu.vdd_v
    for key in ("cortex-m4", "cortex-m33"):
        assert "001-84499" in MCUS[key].source  # the SPI F-RAM they checkpoint to
    assert "SX1276" in RADIOS["lora"].source and "nRF52840" in RADIOS["ble"].source


def test_lora_sensitivity_falls_with_spreading_factor() -> None:
    assert sorted(LORA_SENSITIVITY_DBM) == list(range(7, 13))
    values = [LORA_SENSITIVITY_DBM[sf] for sf in range(7, 13)]
    assert all(b < a for a, b in itertools.pairwise(values))


def test_negative_macs_is_an_error() -> None:
    with pytest.raises(ConfigError, match="macs"):
        MCUS["cortex-m4"].compute_energy_j(-1)
    assert math.isclose(MCUS["cortex-m4"].compute_energy_j(0), 0.0)
