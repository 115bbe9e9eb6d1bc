"""Bundles: signed, hashed, schema-checked; a tampered, unsigned or invalid bundle is refused with one clear error."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from edge.contract.bundle import (
    MANIFEST,
    SIGNATURE,
    BundleError,
    canonical_json,
    generate_keypair,
    load_private_key,
    load_public_key,
    pack,
    read_bundle,
    tar_bytes,
    write_bundle,
)

MANIFEST_CORE = {
    "schema_version": 1,
    "model": "tiny",
    "task": "digits",
    "labels": [str(d) for d in range(10)],
    "inputs": [{"name": "x", "shape": [1, 1, 8, 8], "dtype": "float32"}],
    "outputs": [{"name": "logits", "shape": [1, 10], "dtype": "float32"}],
    "preprocessing": {"description": "grey levels / 16, standardized", "raw": {"shape": [8, 8], "dtype": "float32"},
                      "steps": [{"op": "scale", "factor": 0.0625}, {"op": "standardize", "mean": 0.3, "std": 0.4},
                                {"op": "reshape", "shape": [1, 8, 8]}]},
    "variants": [{"name": "int8", "bits": 8, "drop": 0.0, "layers": [{"name": "fc", "macs": 640, "param_bytes": 650}],
                  "energy_j": {"msp430fr5994": 3.6e-6}, "accuracy": {"onnx-int8": 0.95}, "formats": {"onnx-int8": "int8.onnx"}}],
    "creator": "trickle 0.1.0",
    "bundle_version": 3,
}
FILES = {"int8.onnx": b"\x08\x07fake-onnx-bytes", "extra/readme.txt": b"hello"}


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    priv, pub = tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub"
    generate_keypair(priv, pub)
    return priv, pub


def signed_dir(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    out = tmp_path / "bundle"
    write_bundle(pack(MANIFEST_CORE, FILES, load_private_key(keys[0])), out)
    return out


def test_round_trip_folder_and_tar(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    trusted = [load_public_key(keys[1])]
    b = read_bundle(signed_dir(tmp_path, keys), trusted)
    assert b.file("int8.onnx") == FILES["int8.onnx"] and b.manifest.bundle_version == 3
    assert b.signed_by is not None
    tar = tmp_path / "bundle.tar"
    tar.write_bytes(tar_bytes(pack(MANIFEST_CORE, FILES, load_private_key(keys[0]))))
    assert read_bundle(tar, trusted).files == b.files


def test_downgrade_or_replay_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    path = signed_dir(tmp_path, keys)  # bundle_version 3
    assert read_bundle(path, newer_than=2).manifest.bundle_version == 3
    for running in (3, 4):
        with pytest.raises(BundleError, match=rf"bundle_version 3 is not newer than the running {running}"):
            read_bundle(path, newer_than=running)


def test_private_key_file_is_private(keys: tuple[Path, Path]) -> None:
    assert keys[0].stat().st_mode & 0o777 == 0o600


def test_tampered_file_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    out = signed_dir(tmp_path, keys)
    (out / "int8.onnx").write_bytes(b"\x08\x07evil-onnx-bytes")
    with pytest.raises(BundleError, match=r"file int8.onnx does not match its sha256"):
        read_bundle(out, [load_public_key(keys[1])])


def test_tampered_manifest_fails_the_signature(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    out = signed_dir(tmp_path, keys)
    doc = json.loads((out / MANIFEST).read_text())
    doc["bundle_version"] = 99
    (out / MANIFEST).write_bytes(canonical_json(doc))
    with pytest.raises(BundleError, match="does not verify against any trusted key"):
        read_bundle(out, [load_public_key(keys[1])])


def test_unsigned_or_unknown_signer_is_refused(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    out = signed_dir(tmp_path, keys)
    other_priv, other_pub = tmp_path / "o.key", tmp_path / "o.pub"
    generate_keypair(other_priv, other_pub)
    with pytest.raises(BundleError, match="does not verify"):
        read_bundle(out, [load_public_key(other_pub)])
    (out / SIGNATURE).unlink()
    with pytest.raises(BundleError, match="unsigned"):
        read_bundle(out, [load_public_key(keys[1])])
    with pytest.raises(BundleError, match="unsigned"):
        read_bundle(out, require_signature=True)
    assert read_bundle(out).signed_by is None  # no key asked for: integrity only


def test_schema_invalid_manifest_is_refused(tmp_path: Path) -> None:
    bad = copy.deepcopy(MANIFEST_CORE)
    bad["variants"][0]["bits"] = 3  # type: ignore[index]
    with pytest.raises(BundleError, match=r"fails schema v1 at variants/0/bits"):
        pack(bad, FILES)
    out = tmp_path / "b"
    write_bundle(pack(MANIFEST_CORE, FILES), out)
    doc = json.loads((out / MANIFEST).read_text())
    del doc["labels"]
    (out / MANIFEST).write_bytes(canonical_json(doc))
    with pytest.raises(BundleError, match="fails schema v1 at labels: Field required"):
        read_bundle(out)


def test_unlisted_or_missing_files_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "b"
    write_bundle(pack(MANIFEST_CORE, FILES), out)
    (out / "stowaway.bin").write_bytes(b"x")
    with pytest.raises(BundleError, match="files not listed in the manifest: stowaway.bin"):
        read_bundle(out)
    (out / "stowaway.bin").unlink()
    (out / "extra" / "readme.txt").unlink()
    with pytest.raises(BundleError, match="file extra/readme.txt listed in the manifest is missing"):
        read_bundle(out)


def test_tar_is_byte_identical_for_the_same_inputs(keys: tuple[Path, Path]) -> None:
    # Ed25519 signatures are deterministic (RFC 8032), so the whole signed tar is too
    key = load_private_key(keys[0])
    a = tar_bytes(pack(MANIFEST_CORE, FILES, key))
    b = tar_bytes(pack(dict(reversed(list(MANIFEST_CORE.items()))), dict(reversed(list(FILES.items()))), key))
    assert a == b


def test_bad_key_files(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    with pytest.raises(BundleError, match="expected 'trickle-ed25519-private'"):
        load_private_key(keys[1])
    (tmp_path / "junk.key").write_text("not json")
    with pytest.raises(BundleError, match="not a trickle-ed25519-public key file"):
        load_public_key(tmp_path / "junk.key")
    with pytest.raises(BundleError, match="no such bundle"):
        read_bundle(tmp_path / "nothing-here")
