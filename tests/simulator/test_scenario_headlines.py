"""Each bundled scenario, run as shipped (fleet_1000 with 20 of its nodes), shows the behaviour
its description names: a newcomer's first contact cannot silently stop showing what it is for."""

from __future__ import annotations

from typing import Any

import pytest

from edge.core.files import data_root
from simulator.config import SCENARIO_DIR, load_scenario
from simulator.fleet import simulate


def _run(name: str, **over: Any) -> dict[str, Any]:
    text = (SCENARIO_DIR / f"{name}.toml").read_text()
    if any(f'kind = "{k}"' in text for k in ("nrel", "iv_curve")) and not (data_root() / "harvest").is_dir():
        pytest.skip("needs the data folder (TRICKLE_DATA)")
    return simulate(load_scenario(SCENARIO_DIR / f"{name}.toml", run={"workers": 1}, **over)).summary


def test_every_bundled_scenario_has_a_headline_test() -> None:
    assert {p.stem for p in SCENARIO_DIR.glob("*.toml")} == set(HEADLINES)


def _fleet_1000(s: dict[str, Any]) -> None:  # solar with shading: nodes fail at dusk, LoRa uplinks arrive
    assert s["power_cycles"] > 0 and s["packets_delivered"] > 0.5 * s["packets_sent"]


def _indoor_office(s: dict[str, Any]) -> None:  # jit checkpoints, BLE delivered in the office
    assert s["checkpoints"] > 0 and s["power_cycles"] > 0
    assert s["packets_delivered"] > 0 and s["packets_below_sensitivity"] == 0


def _nrel_24h(s: dict[str, Any]) -> None:  # one node through a day: it fails and resumes
    assert s["power_cycles"] > 10 and s["completed"] > 0 and s["packets_delivered"] > 0


def _piezo_machine(s: dict[str, Any]) -> None:  # restart starves: work rolled back, events lost, deadlines missed
    assert s["power_cycles"] > 10 and s["lost_work_j"] > 0 and s["missed"] + s["lost_off"] > 0.1 * s["released"]


def _rf_powercast(s: dict[str, Any]) -> None:  # SONIC-style: fails every few seconds, finishes nearly every task
    assert s["power_cycles"] > 100 and s["completed_fraction"] > 0.9
    restart = _run("rf_powercast", workload={"policy": "restart"})
    assert restart["completed"] < 0.5 * s["completed"]  # the same node without loop continuation


def _rf_scarce(s: dict[str, Any]) -> None:  # the demo's fleet: less harvest than the task wants, many failures an hour
    assert s["power_cycles"] > 10 * s["nodes"] and 0.1 < s["completed_fraction"] < 0.9 and s["lost_work_j"] > 0


def _teg_pipe(s: dict[str, Any]) -> None:  # browns out as the pipe cools, delivers while warm
    assert s["power_cycles"] > 0 and s["completed"] > 0 and s["packets_delivered"] > 0


def _botoks_sense_send(s: dict[str, Any]) -> None:  # browns out every second or so, still sends each on-period
    assert s["power_cycles"] > 100 and s["packets_delivered"] > 0.5 * s["power_cycles"]
    assert s["phase_init_completed"] >= s["power_cycles"]  # INIT runs at every boot
    assert s["on_period_max_s"] < 1.0 < s["off_period_mean_s"]


def _jit_checkpoint(s: dict[str, Any]) -> None:  # every failure falls on a checkpoint: nothing rolled back
    assert s["power_cycles"] > 0 and s["checkpoints"] >= s["power_cycles"] and s["lost_work_j"] == 0
    assert s["phase_init_completed"] < s["boots"]  # boots after a checkpoint restore instead of re-running INIT
    assert s["phase_send_completed"] > 0 and s["packets_delivered"] > 0


def _bq25570_indoor(s: dict[str, Any]) -> None:  # cold start at dawn, a day of work, a brown-out after dusk
    assert s["power_cycles"] >= s["nodes"] and s["completed"] > 100 and s["packets_delivered"] > 100
    assert s["lost_off"] > 0  # sensing events that found the node off: the night and the cold start
    assert s["input_loss_j"] > 0.1 * s["harvested_j"]  # the charger's losses are booked


HEADLINES = {"bq25570_indoor": _bq25570_indoor, "botoks_sense_send": _botoks_sense_send, "jit_checkpoint": _jit_checkpoint,
             "fleet_1000": _fleet_1000, "indoor_office": _indoor_office, "nrel_24h": _nrel_24h,
             "piezo_machine": _piezo_machine, "rf_powercast": _rf_powercast, "rf_scarce": _rf_scarce, "teg_pipe": _teg_pipe}


@pytest.mark.parametrize("name", sorted(HEADLINES))
def test_the_scenario_shows_what_it_says(name: str) -> None:
    over: dict[str, Any] = {"nodes": {"count": 20}} if name == "fleet_1000" else {}
    HEADLINES[name](_run(name, **over))
