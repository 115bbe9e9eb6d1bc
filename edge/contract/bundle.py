"""Bundles: the contract between training and devices (see docs/concepts/architecture.md).

A bundle is a folder, or a tar of one, holding ``manifest.json`` (the typed ``edge.contract.manifest.Manifest``;
its JSON Schema is in ``edge/contract/schemas/``), the model files it lists with their sha256, and ``manifest.sig``: an
Ed25519 signature over the manifest's exact bytes, which are canonical JSON (sorted keys,
no spaces, UTF-8). Loading checks, in this order: the manifest parses and matches the
typed model; the signature verifies against a trusted key (when keys are given or required);
every listed file exists with its hash and nothing else is there. Any failure is one
``BundleError`` naming what failed.

Key files are JSON: ``{"kind": "trickle-ed25519-private" | "trickle-ed25519-public",
"key": "<base64 of the 32 raw key bytes>"}``; the private one is written with mode 0600.
"""

from __future__ import annotations

import base64
import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import tarfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edge.contract.manifest import SCHEMA_VERSION, LmDraftManifest, Manifest, canonical_json
from edge.core.errors import BundleError
from edge.core.files import write_atomic, write_secret

__all__ = ["MANIFEST", "SCHEMA_VERSION", "SIGNATURE", "Bundle", "BundleError", "LmDraftBundle", "LmDraftManifest",
           "Manifest", "canonical_json", "generate_keypair", "load_private_key", "load_public_key", "pack", "read_bundle",
           "read_lm_draft", "read_trusted", "sha256_hex", "write_bundle"]

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
_PRIVATE, _PUBLIC = "trickle-ed25519-private", "trickle-ed25519-public"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- keys ---------------------------------------------------------------------------------------


def generate_keypair(private_path: Path, public_path: Path) -> None:
    """Write a new Ed25519 key pair in trickle's key file format."""
    key = Ed25519PrivateKey.generate()
    raw_private = key.private_bytes_raw()
    raw_public = key.public_key().public_bytes_raw()
    write_secret(private_path, json.dumps({"kind": _PRIVATE, "key": base64.b64encode(raw_private).decode()}))
    write_atomic(public_path, json.dumps({"kind": _PUBLIC, "key": base64.b64encode(raw_public).decode()}))


def _read_key(path: Path, kind: str) -> bytes:
    try:
        doc = json.loads(Path(path).read_text())
        if doc.get("kind") != kind:
            raise BundleError(f"key file {path}: kind is {doc.get('kind')!r}, expected {kind!r}")
        raw = base64.b64decode(doc["key"], validate=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, BundleError):
            raise
        raise BundleError(f"key file {path}: not a {kind} key file ({e})") from None
    if len(raw) != 32:
        raise BundleError(f"key file {path}: an Ed25519 key has 32 bytes, this one {len(raw)}")
    return raw


def load_private_key(path: Path) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_read_key(path, _PRIVATE))


def load_public_key(path: Path) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(_read_key(path, _PUBLIC))


# ---- reading and verifying -------------------------------------------------------------------------


@dataclass(frozen=True)
class Bundle:
    """A verified classifier bundle: its manifest, its files' bytes and where it was read from."""

    manifest: Manifest
    files: dict[str, bytes]  # every listed file, verified
    signed_by: Ed25519PublicKey | None

    def file(self, name: str) -> bytes:
        return self.files[name]


def read_bundle(path: str | os.PathLike[str], trusted_keys: list[Ed25519PublicKey] | None = None,
                require_signature: bool = False, newer_than: int | None = None) -> Bundle:
    """Load and verify a bundle folder or tar; refuse it with one BundleError on any failure.

    ``newer_than``: the bundle_version a device runs now; an equal or older bundle is refused
    (checked after the signature, so the version read is the signer's).
    """
    members = _members(Path(path))
    if MANIFEST not in members:
        raise BundleError(f"{path}: no {MANIFEST}")
    raw_manifest = members.pop(MANIFEST)
    if _kind(raw_manifest) == "lm-draft":
        raise BundleError(f"{path}: a language-model draft bundle (use it with trickle edge generate --bundle)")
    manifest = Manifest.from_json(raw_manifest, f"{path}: {MANIFEST}")
    signer = _verify(path, raw_manifest, members, manifest.files, manifest.bundle_version, trusted_keys,
                     require_signature, newer_than)
    return Bundle(manifest, members, signer)


@dataclass(frozen=True)
class LmDraftBundle:
    """A verified lm-draft bundle (a language model's device draft): its manifest and files."""

    manifest: LmDraftManifest
    files: dict[str, bytes]
    signed_by: Ed25519PublicKey | None


def read_lm_draft(path: str | os.PathLike[str], trust: Sequence[str | os.PathLike[str] | Ed25519PublicKey] = ()
                  ) -> LmDraftBundle:
    """Load and verify a language-model draft bundle (``kind`` "lm-draft"), as ``read_trusted``
    does a classifier's: with trusted keys, it must be signed by one; hashes always checked."""
    keys = [k if isinstance(k, Ed25519PublicKey) else load_public_key(Path(k)) for k in trust]
    members = _members(Path(path))
    if MANIFEST not in members:
        raise BundleError(f"{path}: no {MANIFEST}")
    raw_manifest = members.pop(MANIFEST)
    if _kind(raw_manifest) != "lm-draft":
        raise BundleError(f"{path}: not a language-model draft bundle (export one with trickle export DRAFT --target T)")
    manifest = LmDraftManifest.from_json(raw_manifest, f"{path}: {MANIFEST}")
    signer = _verify(path, raw_manifest, members, manifest.files, manifest.bundle_version, keys or None, bool(keys), None)
    return LmDraftBundle(manifest, members, signer)


def _kind(raw_manifest: bytes) -> object:
    try:
        doc = json.loads(raw_manifest)
    except ValueError:
        return None
    return doc.get("kind") if isinstance(doc, dict) else None


def _verify(path: object, raw_manifest: bytes, members: dict[str, bytes], listed: dict[str, str], version: int,
            trusted_keys: list[Ed25519PublicKey] | None, require_signature: bool, newer_than: int | None
            ) -> Ed25519PublicKey | None:
    """The signature, the version and every file's hash; the signer (None: not checked)."""
    signer = _check_signature(raw_manifest, members.pop(SIGNATURE, None), trusted_keys, require_signature, path)
    if newer_than is not None and version <= newer_than:
        raise BundleError(f"{path}: bundle_version {version} is not newer than the running "
                          f"{newer_than} (refusing a downgrade or a replay)")
    for name, digest in sorted(listed.items()):
        if name not in members:
            raise BundleError(f"{path}: file {name} listed in the manifest is missing")
        if sha256_hex(members[name]) != digest:
            raise BundleError(f"{path}: file {name} does not match its sha256 in the manifest (tampered or corrupt)")
    extra = sorted(set(members) - set(listed))
    if extra:
        raise BundleError(f"{path}: files not listed in the manifest: {', '.join(extra)}")
    return signer


def read_trusted(path: str | os.PathLike[str], trust: Sequence[str | os.PathLike[str] | Ed25519PublicKey] = (),
                 newer_than: int | None = None) -> Bundle:
    """``read_bundle`` as every command takes it: with trusted public keys given (key files, as
    ``--trust`` names them, or loaded keys), the bundle must be signed by one of them; without,
    the signature is not checked."""
    keys = [k if isinstance(k, Ed25519PublicKey) else load_public_key(Path(k)) for k in trust]
    return read_bundle(path, keys or None, require_signature=bool(keys), newer_than=newer_than)


# What a bundle may hold, checked member by member before anything is read past it (a bundle is
# read before its signature can be checked: these bound what an unsigned or hostile file costs).
MAX_MEMBERS = 512
MAX_MEMBER_BYTES = 128 << 20
MAX_TOTAL_BYTES = 256 << 20
MAX_COMPRESSION_RATIO = 100  # uncompressed / compressed bytes, once past RATIO_AFTER_BYTES
RATIO_AFTER_BYTES = 1 << 20
_CHUNK = 1 << 16
_TAR_OVERHEAD = 1024  # a member's header blocks and padding, counted against the total
_MAGIC: tuple[tuple[bytes, Callable[[Any], Any]], ...] = (
    (b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw)), (b"\xfd7zXZ\x00", lzma.LZMAFile), (b"BZh", bz2.BZ2File))


class _Bounded(io.RawIOBase):
    """A decompressed stream read through a budget: at most ``MAX_TOTAL_BYTES`` (plus headers) in
    all, and at most ``MAX_COMPRESSION_RATIO`` times the compressed bytes consumed so far."""

    def __init__(self, inner: Any, raw: Any, path: Path) -> None:
        self.inner, self.raw, self.path, self.total = inner, raw, path, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        self.total += len(data)
        if self.total > MAX_TOTAL_BYTES + MAX_MEMBERS * _TAR_OVERHEAD:
            raise BundleError(f"{self.path}: over {MAX_TOTAL_BYTES >> 20} MiB uncompressed (refused before reading on)")
        compressed = max(1, self.raw.tell()) if self.raw is not None else None
        if compressed is not None and self.total > RATIO_AFTER_BYTES and self.total > MAX_COMPRESSION_RATIO * compressed:
            raise BundleError(f"{self.path}: compressed more than {MAX_COMPRESSION_RATIO}:1 (a decompression bomb?)")
        buffer[: len(data)] = data
        return len(data)


def _member_rule(path: Path, name: str, kind: str, size: int, count: int, total: int, seen: dict[str, bytes]) -> None:
    """Raise BundleError naming the rule a member breaks: a regular file, a relative path inside
    the bundle, a new name, and within the count and size caps."""
    if kind != "file":
        raise BundleError(f"{path}: member {name!r} is a {kind}; a bundle holds regular files only")
    if name.startswith("/") or "\\" in name or ".." in name.split("/") or not name:
        raise BundleError(f"{path}: member {name!r}: path escapes the bundle")
    if name in seen:
        raise BundleError(f"{path}: member {name!r} appears twice")
    if count > MAX_MEMBERS:
        raise BundleError(f"{path}: more than {MAX_MEMBERS} members")
    if size > MAX_MEMBER_BYTES:
        raise BundleError(f"{path}: member {name!r} of {size} bytes: over {MAX_MEMBER_BYTES >> 20} MiB")
    if total + size > MAX_TOTAL_BYTES:
        raise BundleError(f"{path}: members over {MAX_TOTAL_BYTES >> 20} MiB in all")


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym() or member.islnk():
        return "link"
    if member.issparse():
        return "sparse file"
    if member.isdir():
        return "folder"
    return "file" if member.isreg() else "device or fifo"


def _members(path: Path) -> dict[str, bytes]:
    """Every file of a bundle folder or tar (plain, gzip, xz or bzip2), each checked by
    ``_member_rule`` before it is read, and read in chunks through the size and ratio budget."""
    if path.is_dir():
        return _folder_members(path)
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle")
    members: dict[str, bytes] = {}
    with open(path, "rb") as raw:
        head = raw.read(6)
        raw.seek(0)
        opener = next((cls for magic, cls in _MAGIC if head.startswith(magic)), None)
        inner = opener(raw) if opener is not None else raw
        stream = io.BufferedReader(_Bounded(inner, raw if opener is not None else None, path), _CHUNK)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                total = 0
                for count, member in enumerate(tar, 1):
                    if member.isdir():  # a folder entry holds nothing (tar -cf of a folder writes them)
                        continue
                    _member_rule(path, member.name, _tar_kind(member), member.size, count, total, members)
                    total += member.size
                    fh = tar.extractfile(member)
                    assert fh is not None
                    members[member.name] = fh.read()  # its size is within the caps: checked above
        except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as e:
            raise BundleError(f"{path}: not a bundle folder or tar ({e})") from None
    return members


def _folder_members(path: Path) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    total = 0
    for count, p in enumerate(sorted(path.rglob("*")), 1):
        if p.is_dir() and not p.is_symlink():
            continue
        name = p.relative_to(path).as_posix()
        kind = "link" if p.is_symlink() else "file" if p.is_file() else "device or fifo"
        size = p.stat().st_size if kind == "file" else 0
        _member_rule(path, name, kind, size, count, total, members)
        total += size
        members[name] = p.read_bytes()
    return members


def _check_signature(raw: bytes, signature: bytes | None, trusted: list[Ed25519PublicKey] | None,
                     required: bool, path: object) -> Ed25519PublicKey | None:
    if signature is None:
        if required or trusted:
            raise BundleError(f"{path}: unsigned ({SIGNATURE} missing) but a signature is required")
        return None
    if not trusted:
        if required:
            raise BundleError(f"{path}: a signature is required but no trusted public key was given")
        return None
    for key in trusted:
        try:
            key.verify(signature, raw)
            return key
        except InvalidSignature:
            continue
    raise BundleError(f"{path}: {SIGNATURE} does not verify against any trusted key (tampered manifest or unknown signer)")


# ---- writing (the format's other half; export/ builds the contents) -----------------------------


def pack(manifest: Manifest | dict[str, Any], files: dict[str, bytes], key: Ed25519PrivateKey | None = None
         ) -> dict[str, bytes]:
    """The bundle's members: the files, the manifest with their hashes, and the signature.
    ``manifest``'s own ``files`` (if any) are replaced by the hashes of ``files``."""
    doc = manifest.to_dict() if isinstance(manifest, Manifest) else dict(manifest)
    doc["files"] = {name: sha256_hex(data) for name, data in sorted(files.items())}
    # refuse to write what a device would refuse
    if doc.get("kind") == "lm-draft":
        raw = LmDraftManifest.from_json(canonical_json(doc), f"new bundle: {MANIFEST}").to_json()
    else:
        raw = Manifest.from_dict(doc, f"new bundle: {MANIFEST}").to_json()
    out = {**files, MANIFEST: raw}
    if key is not None:
        out[SIGNATURE] = key.sign(raw)
    return out


def write_bundle(members: dict[str, bytes], out: Path) -> Path:
    """Write a bundle to ``out``: a deterministic tar when it ends in .tar, else a folder (each
    file written atomically). Returns ``out``."""
    if out.suffix == ".tar":
        write_atomic(out, tar_bytes(members))
    else:
        for name, data in sorted(members.items()):
            write_atomic(out / name, data)
    return out


def tar_bytes(members: dict[str, bytes]) -> bytes:
    """A deterministic uncompressed tar: sorted names, zero times and owners, mode 0644."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
