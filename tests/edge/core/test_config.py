"""The plumbing every tier shares: typed configs with TOML and --set, atomic files, one error family."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pydantic import Field

from edge.core.config import Config, apply_sets, load_config, parse_toml_value
from edge.core.errors import ConfigError, TrickleError
from edge.core.files import data_root, write_atomic, write_secret


class Inner(Config):
    gain_db: float = Field(0.0, ge=-30, le=30)
    """Antenna gain."""


class Example(Config):
    port: int = Field(8080, ge=1, le=65535)
    """HTTP port."""
    name: str = "node"
    """A name."""
    radio: Inner = Inner()


def test_precedence_defaults_file_flags_sets(tmp_path: Path) -> None:
    assert load_config(Example) == Example()
    (tmp_path / "c.toml").write_text('port = 9000\nname = "from-file"\n[radio]\ngain_db = 3.0\n')
    cfg = load_config(Example, tmp_path / "c.toml", sets=["radio.gain_db=6"], flags={"name": "from-flag", "port": None})
    assert (cfg.port, cfg.name, cfg.radio.gain_db) == (9000, "from-flag", 6.0)  # None flags do not override
    assert load_config(Example, tmp_path / "c.toml", sets=['name="from-set"'], flags={"name": "x"}).name == "from-set"


def test_bad_values_are_one_config_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^radio.gain_db = 99: should be less than or equal to 30$"):
        load_config(Example, sets=["radio.gain_db=99"])
    with pytest.raises(ConfigError, match=r"^colour = 'red': Extra inputs are not permitted$"):
        load_config(Example, sets=['colour="red"'])
    with pytest.raises(ConfigError, match="expected FIELD=VALUE or SECTION.FIELD=VALUE"):
        load_config(Example, sets=["port"])
    with pytest.raises(ConfigError, match="--config = .*: file not found"):
        load_config(Example, tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("port = = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(Example, tmp_path / "bad.toml")
    assert issubclass(ConfigError, TrickleError) and not issubclass(ConfigError, ValueError)


def test_set_values_are_toml() -> None:
    assert parse_toml_value("0.047") == 0.047 and parse_toml_value("true") is True and parse_toml_value("[1, 2]") == [1, 2]
    assert parse_toml_value("jit") == "jit"  # a bare word stays a string
    with pytest.raises(ConfigError, match="is a value, not a table"):
        apply_sets({"port": 1}, ["port.x=2"])


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "sub" / "f.json"
    write_atomic(target, "old")

    def crash(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["f.json"]


def test_secrets_are_owner_only(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "token", "s3cret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "s3cret"


def test_data_root_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRICKLE_DATA", str(tmp_path / "env"))
    assert data_root(tmp_path / "flag") == tmp_path / "flag" and data_root() == tmp_path / "env"
    monkeypatch.delenv("TRICKLE_DATA")
    assert data_root().parts[-2:] == ("shared", "data")
