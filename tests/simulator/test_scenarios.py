"""Every bundled scenario runs (shortened), and event-trace sensing follows the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.core.files import data_root
from simulator.config import SCENARIO_DIR, load_scenario
from simulator.fleet import simulate


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_bundled_scenario_runs(path: Path) -> None:
    uses_shared_data = any(f'kind = "{k}"' in path.read_text() for k in ("nrel", "iv_curve"))
    if uses_shared_data and not (data_root() / "harvest").is_dir():
        pytest.skip("needs the data folder (TRICKLE_DATA)")
    sc = load_scenario(path, run={"duration_s": 600.0, "workers": 1}, nodes={"count": 2})
    s = simulate(sc).summary
    assert s["released"] == s["lost_off"] + s["dropped"] + s["completed"] + s["missed"] + s["unfinished"]
    assert s["harvested_j"] >= 0.0 and s["load_j"] >= 0.0


def test_sensing_from_event_trace(tmp_path: Path) -> None:
    events = tmp_path / "events.csv"
    events.write_text("time_s\n5\n5.01\n5.02\n250\n900\n")  # 900 s lies past the end and is ignored
    sc = load_scenario(None, run={"duration_s": 600.0, "workers": 1},
                       harvester={"kind": "constant", "power_w": 0.05},
                       storage={"v_initial_v": 3.0},
                       workload={"sense_trace": str(events), "queue_capacity": 1},
                       nodes={"count": 1})
    st = simulate(sc).nodes[0].stats
    assert st.released == 4
    # a task takes ~0.4 s: 5.01 s waits in the queue, 5.02 s finds it full and is dropped
    assert (st.completed, st.dropped) == (3, 1)
