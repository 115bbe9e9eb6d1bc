"""MCU and radio power profiles, and the airtime of one LoRa or BLE packet.

Each number comes from a datasheet named in the profile's ``source``, which also says
how the derived ones were computed (energy per byte of non-volatile memory) and marks
the estimates (cycles per MAC, the STM32 boot times).
Currents are typical values at the supply voltage ``vdd_v`` the datasheet quotes.

    from simulator.devices import RADIOS, lora_airtime_s, packet_energy_j
    energy_j = packet_energy_j(RADIOS["lora"], lora_airtime_s(16, sf=9))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from edge.core.errors import ConfigError

# Cycles of a sub-byte MAC relative to int8 (NExUME's energy-per-operation-at-precision): packed
# operands halve (4 bit) or quarter (2 bit) the loads per MAC, unpacking adds shifts and masks.
# An engineering estimate, to be replaced by instruction counts measured on the firmware.
PRECISION_CYCLE_FACTOR: dict[int, float] = {8: 1.0, 4: 0.7, 2: 0.5}


def _precision_factor(bits: int) -> float:
    if bits not in PRECISION_CYCLE_FACTOR:
        raise ConfigError("bits", bits, f"must be one of {sorted(PRECISION_CYCLE_FACTOR)}")
    return PRECISION_CYCLE_FACTOR[bits]


@dataclass(frozen=True)
class McuProfile:
    """One microcontroller with its non-volatile memory (on-chip FRAM or an SPI FRAM).

    ``nvm_*_j_per_byte`` is the whole node's energy to move one byte (core awake plus
    memory), so a caller must not add ``active_power_w()`` for the NVM time on top.
    """

    name: str
    vdd_v: float  # supply the currents are quoted at
    clock_hz: float
    active_a_per_hz: float  # datasheet µA/MHz as A/Hz
    sleep_a: float  # retention sleep with a wake-up timer running
    brown_out_v: float  # lowest operating supply
    boot_s: float  # power-up (BOR) to main, clock start-up included
    cycles_per_mac: float  # int8 MAC with loads in a dense/conv inner loop (estimate)
    nvm_write_j_per_byte: float
    nvm_read_j_per_byte: float
    nvm_write_s_per_byte: float
    nvm_read_s_per_byte: float
    source: str

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("name", "source", "sleep_a", "boot_s") and not value > 0:
                raise ConfigError(f"{self.name}.{f.name}", value, "must be > 0")
        for name in ("sleep_a", "boot_s"):  # a firmware may start at once
            if getattr(self, name) < 0:
                raise ConfigError(f"{self.name}.{name}", getattr(self, name), "must be >= 0")

    def active_power_w(self) -> float:
        return self.active_a_per_hz * self.clock_hz * self.vdd_v

    def sleep_power_w(self) -> float:
        return self.sleep_a * self.vdd_v

    def energy_per_cycle_j(self) -> float:
        return self.active_a_per_hz * self.vdd_v

    def compute_time_s(self, macs: float, bits: int = 8) -> float:
        return _non_negative("macs", macs) * self.cycles_per_mac * _precision_factor(bits) / self.clock_hz

    def compute_energy_j(self, macs: float, bits: int = 8) -> float:
        """Energy of ``macs`` MACs at ``bits``-bit weights and activations: the shared cost model."""
        return _non_negative("macs", macs) * self.cycles_per_mac * _precision_factor(bits) * self.energy_per_cycle_j()

    def boot_energy_j(self) -> float:
        """Upper bound: the whole boot is charged at full-clock active power."""
        return self.boot_s * self.active_power_w()


@dataclass(frozen=True)
class RadioProfile:
    """A radio's supply voltage and currents (transmit, receive, sleep) and its timings."""

    name: str
    vdd_v: float
    tx_a: float
    rx_a: float
    sleep_a: float
    startup_s: float  # sleep to first transmitted bit, charged at tx_a
    source: str


def _non_negative(field: str, value: float) -> float:
    if not value >= 0:
        raise ConfigError(field, value, "must be >= 0")
    return float(value)


def _spi_fram_byte(mcu_active_a: float, fram_a: float, vdd_v: float, sck_hz: float) -> tuple[float, float]:
    """(J, s) per byte over SPI: 8 clocks per byte, core and FRAM both drawing current.

    The opcode and 3-byte address of each transfer are left out: checkpoints move
    blocks of hundreds of bytes, where they add under 2 %.
    """
    t_byte_s = 8.0 / sck_hz
    return (mcu_active_a + fram_a) * vdd_v * t_byte_s, t_byte_s


# MSP430FR5994 at 8 MHz, the fastest clock with zero FRAM wait states (SLASE54D).
_MSP_VDD_V, _MSP_CLOCK_HZ, _MSP_A_PER_HZ = 3.0, 8e6, 118e-6 / 1e6
# DMA moves a word in 2 MCLK cycles (SLAU367P ch. 11, DMA transfer cycle time): 1 cycle/byte.
_MSP_NVM_J = _MSP_A_PER_HZ * _MSP_VDD_V * 1.0
_MSP_NVM_S = 1.0 / _MSP_CLOCK_HZ

# Cypress/Infineon FM25V10 SPI F-RAM, doc. 001-84499: 40 MHz SCK max, IDD 2.5 mA typ at 40 MHz.
_FRAM_SCK_HZ, _FRAM_A = 40e6, 2.5e-3
_L476_NVM_J, _L476_NVM_S = _spi_fram_byte(100e-6 * 80, _FRAM_A, 3.0, _FRAM_SCK_HZ)
_U575_NVM_J, _U575_NVM_S = _spi_fram_byte(19.5e-6 * 160, _FRAM_A, 3.3, _FRAM_SCK_HZ)

MCUS: dict[str, McuProfile] = {
    "msp430fr5994": McuProfile(
        name="msp430fr5994",
        vdd_v=_MSP_VDD_V,
        clock_hz=_MSP_CLOCK_HZ,
        active_a_per_hz=_MSP_A_PER_HZ,
        sleep_a=0.5e-6,
        brown_out_v=1.8,
        boot_s=0.5e-3,
        cycles_per_mac=16.0,
        nvm_write_j_per_byte=_MSP_NVM_J,
        nvm_read_j_per_byte=_MSP_NVM_J,
        nvm_write_s_per_byte=_MSP_NVM_S,
        nvm_read_s_per_byte=_MSP_NVM_S,
        source=(
            "TI SLASE54D (MSP430FR599x datasheet): §1.1 active 118 uA/MHz, LPM3 with VLO 500 nA, "
            "supply 1.8-3.6 V; 'Wake-up times from low-power modes and reset' tWAKE-UP-BOR 0.5 ms typ; "
            "8 MHz = max MCLK without FRAM wait states. NVM derived: DMA 2 MCLK cycles per word "
            "(SLAU367P ch. 11) = 1 cycle/byte -> 118 uA/MHz x 3.0 V x 1 cycle = 0.354 nJ/byte, 125 ns/byte. "
            "cycles_per_mac estimated (no LEA): 2 byte loads, 2 sign extends, MPY32 MACS/OP2 stores, loop ~16."
        ),
    ),
    "cortex-m4": McuProfile(
        name="stm32l476",
        vdd_v=3.0,
        clock_hz=80e6,
        active_a_per_hz=100e-6 / 1e6,
        sleep_a=1.4e-6,
        brown_out_v=1.71,
        boot_s=0.3e-3,
        cycles_per_mac=2.5,
        nvm_write_j_per_byte=_L476_NVM_J,
        nvm_read_j_per_byte=_L476_NVM_J,
        nvm_write_s_per_byte=_L476_NVM_S,
        nvm_read_s_per_byte=_L476_NVM_S,
        source=(
            "ST DS10198 (STM32L476xx datasheet) features: run 100 uA/MHz (LDO), Stop 2 with RTC 1.4 uA, "
            "1.71-3.6 V, 80 MHz max. boot_s is an estimate (reset temporization ~250 us plus PLL lock), "
            "not a datasheet figure. NVM: external FM25V10 SPI F-RAM (Cypress 001-84499, IDD 2.5 mA typ "
            "at 40 MHz SCK); derived (8.0 mA core + 2.5 mA FRAM) x 3.0 V x 8 bits / 40 MHz = 6.3 nJ/byte, "
            "200 ns/byte. cycles_per_mac: measured, firmware/ int8 kernels on QEMU mps2-an386 (trickle bench "
            "firmware: 2.1-3.3 instructions per MAC by model and variant, taken as cycles; a real M4's flash "
            "wait states would add to it). A bundle recorded with trickle flash --record gives per-layer counts."
        ),
    ),
    "cortex-m33": McuProfile(
        name="stm32u575",
        vdd_v=3.3,
        clock_hz=160e6,
        active_a_per_hz=19.5e-6 / 1e6,
        sleep_a=4.0e-6,
        brown_out_v=1.71,
        boot_s=0.5e-3,
        cycles_per_mac=2.5,
        nvm_write_j_per_byte=_U575_NVM_J,
        nvm_read_j_per_byte=_U575_NVM_J,
        nvm_write_s_per_byte=_U575_NVM_S,
        nvm_read_s_per_byte=_U575_NVM_S,
        source=(
            "ST DS13737 (STM32U575xx datasheet) features: run 19.5 uA/MHz at 3.3 V (SMPS), Stop 2 with "
            "16 KB SRAM 4.0 uA, 1.71-3.6 V, 160 MHz max. boot_s is an estimate (reset temporization, "
            "option-byte load, PLL lock), not a datasheet figure. NVM: external FM25V10 SPI F-RAM "
            "(Cypress 001-84499, 2.5 mA at 40 MHz); derived (3.12 mA core + 2.5 mA FRAM) x 3.3 V x "
            "8 bits / 40 MHz = 3.7 nJ/byte, 200 ns/byte. cycles_per_mac as measured for the M4 (same DSP "
            "extension, not measured on an M33)."
        ),
    ),
}

def known_mcu(name: str, field: str) -> str:
    """``name`` if it is a profile in MCUS, else a ConfigError naming ``field``."""
    if name not in MCUS:
        raise ConfigError(field, name, f"must be one of {sorted(MCUS)}")
    return name


RADIOS: dict[str, RadioProfile] = {
    "ble": RadioProfile(
        name="nrf52840",
        vdd_v=3.0,
        tx_a=6.40e-3,
        rx_a=6.26e-3,
        sleep_a=1.5e-6,
        startup_s=40e-6,
        source=(
            "Nordic nRF52840 Product Specification, Current consumption > Radio transmitting/receiving: "
            "IRADIO_TX1 6.40 mA (0 dBm, 1 Mbps BLE, HFXO, DC/DC), IRADIO_RX0 6.26 mA; RADIO timing "
            "tTXEN,FAST 40 us (fast ramp-up, the Zephyr controller default). sleep_a 1.5 uA is ION_RAMOFF_RTC "
            "(System ON, wake on RTC) as recalled from the Sleep table, not re-checked."
        ),
    ),
    "lora": RadioProfile(
        name="sx1276",
        vdd_v=3.3,
        tx_a=29e-3,
        rx_a=10.8e-3,
        sleep_a=0.2e-6,
        startup_s=310e-6,
        source=(
            "Semtech SX1276/77/78/79 datasheet Rev. 4, Table 6: IDDT 29 mA at +13 dBm on RFO_HF (the table's "
            "point nearest +14 dBm; RFO tops out at +14 dBm), IDDR 10.8 mA (LnaBoost off, band 1), IDDSL "
            "0.2 uA. startup = TS_OSC 250 us (sleep to standby) + TS_FS 60 us (standby to FSTX)."
        ),
    ),
}

# SX1276 datasheet Table 10, RFS_L125_HF (band 1, 125 kHz): sensitivity per spreading factor.
LORA_SENSITIVITY_DBM: dict[int, float] = {7: -123.0, 8: -126.0, 9: -129.0, 10: -132.0, 11: -133.0, 12: -136.0}
# nRF52840 PS, RADIO chapter: 1 Mbps BLE sensitivity with an ideal transmitter.
BLE_SENSITIVITY_DBM = -95.0

# SX1276 RegModemConfig1 bandwidth settings.
LORA_BANDWIDTHS_HZ = (7.8e3, 10.4e3, 15.6e3, 20.8e3, 31.25e3, 41.7e3, 62.5e3, 125e3, 250e3, 500e3)


def _check_lora_args(payload_bytes: int, sf: int, bandwidth_hz: float, coding_rate: int,
                     preamble_symbols: int, explicit_header: bool) -> None:
    if not 0 <= payload_bytes <= 255:
        raise ConfigError("payload_bytes", payload_bytes, "LoRa payload is 0..255 bytes")
    if not 6 <= sf <= 12:
        raise ConfigError("sf", sf, "spreading factor is 6..12")
    if bandwidth_hz not in LORA_BANDWIDTHS_HZ:
        raise ConfigError("bandwidth_hz", bandwidth_hz, f"one of {LORA_BANDWIDTHS_HZ}")
    if not 1 <= coding_rate <= 4:
        raise ConfigError("coding_rate", coding_rate, "1..4 for 4/5..4/8")
    if not 6 <= preamble_symbols <= 65535:
        raise ConfigError("preamble_symbols", preamble_symbols, "6..65535 (SX1276 RegPreamble)")
    if sf == 6 and explicit_header:
        # SX1276 §4.1.1.2: SF6 works in implicit header mode only.
        raise ConfigError("explicit_header", explicit_header, "SF6 needs explicit_header=False")


def lora_airtime_s(
    payload_bytes: int,
    sf: int = 7,
    bandwidth_hz: float = 125e3,
    coding_rate: int = 1,
    preamble_symbols: int = 8,
    explicit_header: bool = True,
    crc: bool = True,
    low_data_rate_optimize: bool | None = None,
) -> float:
    """Time on air of one LoRa packet: Semtech AN1200.13 §4 / SX1276 datasheet §4.1.1.7.

    ``coding_rate`` 1..4 means 4/5..4/8. Low-data-rate optimisation defaults to on when
    the symbol lasts longer than 16 ms, as the SX1276 datasheet mandates.
    """
    _check_lora_args(payload_bytes, sf, bandwidth_hz, coding_rate, preamble_symbols, explicit_header)
    t_sym_s = 2**sf / bandwidth_hz
    de = int(t_sym_s > 16e-3 if low_data_rate_optimize is None else low_data_rate_optimize)
    ih = 0 if explicit_header else 1
    numerator = 8 * payload_bytes - 4 * sf + 28 + 16 * int(crc) - 20 * ih
    denominator = 4 * (sf - 2 * de)
    n_payload = 8 + max(math.ceil(numerator / denominator) * (coding_rate + 4), 0)
    return (preamble_symbols + 4.25 + n_payload) * t_sym_s


def ble_adv_airtime_s(payload_bytes: int) -> float:
    """One legacy advertising PDU on the 1M PHY (Core spec Vol 6 Part B §2.1): 8 µs per byte.

    ``payload_bytes`` is the advertising data (0..31); the 6-byte AdvA is added here.
    """
    if not 0 <= payload_bytes <= 31:
        raise ConfigError("payload_bytes", payload_bytes, "legacy advertising data is 0..31 bytes")
    preamble, access_address, header, adv_a, crc = 1, 4, 2, 6, 3
    return (preamble + access_address + header + adv_a + payload_bytes + crc) * 8e-6


def packet_energy_j(radio: RadioProfile, airtime_s: float, channels: int = 1) -> float:
    """Transmit energy: (start-up + airtime) at the TX current, once per channel sent on."""
    if channels < 1:
        raise ConfigError("channels", channels, "must be >= 1")
    return channels * (radio.startup_s + _non_negative("airtime_s", airtime_s)) * radio.tx_a * radio.vdd_v
