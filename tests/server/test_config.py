"""The server's and the agent's typed configs as the CLI builds them: defaults < --config < flags < --set,
and a bad value is one ConfigError before anything starts."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.core.config import load_config
from edge.core.errors import ConfigError
from server.service import ServeConfig


def test_the_serve_config_keeps_its_defaults_and_takes_keywords() -> None:
    config = ServeConfig(state_dir=Path("s"), port=8443, trusted_keys=[Path("k.pub")])
    assert (config.state_dir, config.host, config.mqtt_port, config.broker) == (Path("s"), "127.0.0.1", 1883, "embedded")
    assert config.url == "http://127.0.0.1:8443" and config.broker_url == "mqtt://127.0.0.1:1883"
    assert ServeConfig(broker="mqtt://10.0.0.2:1884").broker_url == "mqtt://10.0.0.2:1884"


@pytest.mark.parametrize(("flags", "message"), [
    ({"port": 0}, "port = 0: should be greater than or equal to 1"),
    ({"mqtt_port": 65536}, "mqtt_port = 65536"),
    ({"broker": "tcp://h:1"}, "broker = 'tcp://h:1': must be 'embedded', mqtt://HOST:PORT or mqtts://HOST:PORT"),
    ({"tls_cert": "c.pem"}, "tls_cert = 'c.pem': needs tls_key too"),
    ({"data_dir": "x"}, "data_dir = 'x': Extra inputs are not permitted"),
    ({"llm_tree": "5x2"}, "llm_tree = '5x2': String should match pattern"),
    ({"llm_draft_k": 0}, "llm_draft_k = 0: should be greater than or equal to 1"),
])
def test_a_bad_serve_config_is_one_config_error(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(ServeConfig, flags=flags)
    assert message in str(err.value) and "\n" not in str(err.value)


def _serve_args(*argv: str) -> argparse.Namespace:
    from server.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_serve_flags_override_the_file_and_set_overrides_both(tmp_path: Path) -> None:
    (tmp_path / "serve.toml").write_text('port = 9000\nhost = "0.0.0.0"\nstate_dir = "from-file"\n')
    args = _serve_args("--config", str(tmp_path / "serve.toml"), "--port", "9100", "--set", "port=9200",
                       "--state-dir", str(tmp_path / "state"))
    flags = {"port": args.port, "state_dir": args.state_dir, "host": args.host, "trusted_keys": args.trust}
    config = load_config(ServeConfig, args.config, args.set, flags)
    assert (config.port, config.host, config.state_dir, config.trusted_keys) == (9200, "0.0.0.0", tmp_path / "state", [])


@pytest.mark.parametrize(("argv", "message"), [
    (["--tls-cert", "c.pem"], "needs tls_key too"),
    (["--port", "70000"], "port = 70000"),
    (["--set", "nope=1"], "nope = 1: Extra inputs are not permitted"),
])
def test_trickle_serve_refuses_a_bad_config_before_starting(tmp_path: Path, argv: list[str], message: str) -> None:
    from server.cli import run

    with pytest.raises(ConfigError, match=message):
        run(_serve_args("--state-dir", str(tmp_path / "state"), *argv))
    assert not (tmp_path / "state").exists()  # nothing was started or written


def test_trickle_edge_run_refuses_a_missing_token_file_and_a_negative_period(tmp_path: Path) -> None:
    from edge.cli import add_edge_arguments as add_arguments
    from edge.cli import run_edge as run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = ["run", "--device-id", "n1", "--server", "http://127.0.0.1:1", "--broker", "mqtt://127.0.0.1:2",
            "--state-dir", str(tmp_path / "state")]
    with pytest.raises(ConfigError, match="--token-file = '.*nope.token': no such file"):
        run(parser.parse_args([*base, "--token-file", str(tmp_path / "nope.token")]))
    (tmp_path / "n1.token").write_text("t\n")
    with pytest.raises(ConfigError, match="period_s = -1.0"):
        run(parser.parse_args([*base, "--token-file", str(tmp_path / "n1.token"), "--period-s", "-1"]))
    assert not (tmp_path / "state").exists()


def test_the_cli_modules_import_nothing_heavy() -> None:
    code = ("import sys, time; t = time.perf_counter(); import server.cli, edge.cli; "
            "heavy = [m for m in ('paho', 'httpx', 'fastapi', 'uvicorn', 'torch', 'amqtt') if m in sys.modules]; "
            "print(heavy, time.perf_counter() - t)")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(maxsplit=1)
    assert out[0] == "[]", out
    assert time.perf_counter() - start < 5  # generous on two shared cores; `trickle serve --help` takes ~0.2 s


def test_a_replica_needs_a_shared_broker_and_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="external broker"):
        ServeConfig(state_dir=tmp_path, replica="a", store="postgresql://x@127.0.0.1:5432/db")
    with pytest.raises(ConfigError, match="postgresql"):
        ServeConfig(state_dir=tmp_path, replica="a", broker="mqtt://127.0.0.1:1883")
