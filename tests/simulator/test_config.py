"""Scenario loading: defaults run, TOML overrides, and one-line errors naming field, value and range."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.core.errors import ConfigError
from simulator.config import SCENARIO_DIR, load_scenario


def test_defaults_validate() -> None:
    sc = load_scenario()
    assert sc.run.duration_s == 86400.0
    assert sc.harvester.kind == "panel"
    assert sc.storage.v_off_v < sc.storage.v_on_v <= sc.storage.v_max_v


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_bundled_scenarios_load(path: Path) -> None:
    assert load_scenario(path).name == path.stem


def test_toml_overrides_defaults(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('name = "x"\n[storage]\ncapacitance_f = 0.047\n[harvester]\nkind = "constant"\npower_w = 0.01\n')
    sc = load_scenario(f)
    assert (sc.name, sc.storage.capacitance_f, sc.harvester.power_w) == ("x", 0.047, 0.01)
    assert sc.storage.v_on_v == 3.0  # untouched default


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[storage]\ncapacitance_f = -1\n", "storage.capacitance_f = -1: should be greater than 0"),
        ("[run]\nduration_s = 0\n", "run.duration_s = 0: should be greater than 0"),
        ("[storage]\nv_on_v = 1.5\n", "storage.v_on_v = 1.5: must satisfy v_off_v (2.0) < v_on_v <= v_max_v (3.6)"),
        ("[storage]\nbogus = 1\n", "storage.bogus = 1: Extra inputs are not permitted"),
        ("[harvester]\nkind = \"rf\"\ndistance_m = 0.1\n", "harvester.distance_m = 0.1: should be greater than or equal to 1"),
        ("[harvester]\nkind = \"solar_wind\"\n", "harvester.kind = 'solar_wind': must be one of 'constant', 'current', 'trace'"),
        ("[workload]\nmcu = \"z80\"\n", "workload.mcu = 'z80': must be one of"),
        ("[workload]\npolicy = \"jit\"\njit_threshold_v = 3.3\n", "workload.jit_threshold_v = 3.3: must lie between"),
        ("[network]\nspreading_factor = 13\n", "network.spreading_factor = 13: should be less than or equal to 12"),
    ],
)
def test_bad_values_name_field_value_and_range(tmp_path: Path, toml: str, expected: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_scenario(f)
    message = str(info.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_scenario(tmp_path / "nope.toml")
    f = tmp_path / "broken.toml"
    f.write_text("[run\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(f)


@pytest.mark.parametrize("written", ['"none"', '"None"', "inf"])
def test_no_resistive_leakage_is_writable_in_toml(tmp_path: Path, written: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(f"[storage]\nleakage_r_ohm = {written}\n")
    sc = load_scenario(f)
    assert sc.storage.leakage_r_ohm is None and sc.storage.conductance_s == 0.0
    f.write_text('[storage]\nleakage_r_ohm = "lots"\n')
    with pytest.raises(ConfigError, match="storage.leakage_r_ohm = 'lots'"):
        load_scenario(f)
