"""The manifest as a typed model: the committed JSON Schema is generated from it, bundles written
before it existed still load and run, and bad manifests are refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge.classify.runtime import Runtime
from edge.contract.bundle import BundleError, pack, read_bundle, read_trusted, tar_bytes
from edge.contract.manifest import SCHEMA_FILE, Manifest, json_schema

DATA = Path(__file__).parents[1] / "data"
OLD = DATA / "digits-v1-2026-11.tar"  # written by trickle 0.1.0 before the typed manifest (commit 70f1dbb)
OLD_KEY = DATA / "digits-v1-2026-11.pub"


def test_committed_schema_is_the_models() -> None:
    assert SCHEMA_FILE.read_text() == json_schema(), "run: python -m edge.contract.manifest (and commit edge/contract/schemas/)"


def test_schema_validates_a_real_manifest_with_jsonschema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(_raw_manifest(OLD))
    jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(doc)
    doc["variants"][0]["bits"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(doc)


def _raw_manifest(path: Path) -> bytes:
    import tarfile

    with tarfile.open(path) as tar:
        fh = tar.extractfile("manifest.json")
        assert fh is not None
        return fh.read()


def test_an_old_bundle_still_loads_verifies_and_runs() -> None:
    bundle = read_trusted(OLD, [OLD_KEY])
    m = bundle.manifest
    assert isinstance(m, Manifest) and m.bundle_version == 1 and m.task == "digits" and m.test_vectors is None
    assert {v.bits for v in m.variants} == {2, 4, 8} and all(v.measured is None for v in m.variants)
    assert m.preprocessing.raw is not None and m.preprocessing.raw.shape == [8, 8]
    rt = Runtime(bundle)
    raw = np.full((8, 8), 8.0, dtype=np.float32)
    assert rt.infer(raw).shape == (1, 10)
    poor = rt.choose(voltage_v=2.0001, capacitance_f=1e-6, v_cut_v=2.0, mcu="msp430fr5994")
    rich = rt.choose(voltage_v=3.3, capacitance_f=1e-2, v_cut_v=2.0, mcu="msp430fr5994")
    assert poor.energy_j["msp430fr5994"] <= rich.energy_j["msp430fr5994"]
    assert rt.self_test() is None  # no test vectors in a bundle of that age


def test_typed_round_trip_is_byte_identical() -> None:
    raw = _raw_manifest(OLD)
    assert Manifest.from_json(raw).to_json() == raw  # what the signature covers survives the model


def test_unknown_mcu_is_an_error_listing_the_known_ones() -> None:
    from edge.core.errors import ConfigError

    rt = Runtime(read_bundle(OLD))
    with pytest.raises(ConfigError, match=r"--mcu = 'z80': the bundle has energy costs for \['cortex-m33', "):
        rt.choose(voltage_v=3.0, capacitance_f=0.01, v_cut_v=2.0, mcu="z80")


def test_pack_refuses_what_a_device_would_refuse() -> None:
    doc = Manifest.from_json(_raw_manifest(OLD)).to_dict()
    doc["bundle_version"] = 0
    with pytest.raises(BundleError, match="fails schema v1 at bundle_version: Input should be greater than or equal to 1"):
        pack(doc, {"x.onnx": b"x"})
    doc["bundle_version"] = 2
    doc["surprise"] = 1
    with pytest.raises(BundleError, match="at surprise: Extra inputs are not permitted"):
        tar_bytes(pack(doc, {"x.onnx": b"x"}))
