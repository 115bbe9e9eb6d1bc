"""A bundle archive is checked member by member before it is read on: compression bombs, sparse
members, links and escaping paths are refused with one error naming the rule, in bounded memory
(measured in a process of its own, as the agent reads a bundle)."""

from __future__ import annotations

import gzip
import io
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from edge.contract.bundle import BundleError, read_bundle, tar_bytes

ZEROS_MB = 100  # a member within the size caps, 100 MB once inflated, ~0.1 MB compressed


def _zeros_tar(fh: io.BufferedWriter | gzip.GzipFile | lzma.LZMAFile, size: int) -> None:
    """A tar with one member of ``size`` zero bytes, written in chunks (never held in memory)."""
    with tarfile.open(fileobj=fh, mode="w|") as tar:
        info = tarfile.TarInfo("model.onnx")
        info.size = size

        class Zeros:
            left = size

            def read(self, n: int = -1) -> bytes:
                n = self.left if n < 0 else min(n, self.left)
                self.left -= n
                return bytes(n)

        tar.addfile(info, Zeros())  # type: ignore[arg-type]


def _peak_rss_growth_mb(path: Path) -> tuple[float, str]:
    """Read ``path`` with ``edge.contract.bundle.read_bundle`` in a fresh process: (peak RSS growth in MB
    over the process after its imports, the error it printed)."""
    code = (
        "import resource, sys\n"
        "from edge.contract.bundle import BundleError, read_bundle\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        f"    read_bundle({str(path)!r}); print('ACCEPTED')\n"
        "except BundleError as e:\n"
        "    print(e)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    message, growth = out.strip().rsplit("\n", 1)
    return float(growth), message


@pytest.mark.parametrize("compression", ["gz", "xz"])
def test_a_compression_bomb_is_refused_in_bounded_memory(tmp_path: Path, compression: str) -> None:
    path = tmp_path / f"bomb.tar.{compression}"
    with open(path, "wb") as raw, (gzip.GzipFile(fileobj=raw, mode="wb") if compression == "gz"
                                   else lzma.LZMAFile(raw, "wb")) as packer:
        _zeros_tar(packer, ZEROS_MB << 20)
    assert path.stat().st_size < 2 << 20  # a small file ...
    growth, message = _peak_rss_growth_mb(path)
    assert "compressed more than 100:1" in message
    assert growth < 50, f"reading the bomb grew RSS by {growth:.0f} MB"


def test_a_member_over_the_size_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A sparse-looking giant: the header claims 2 GB; nothing of it is read."""
    path = tmp_path / "huge.tar"
    header = tarfile.TarInfo("model.onnx")
    header.size = 2 << 30
    path.write_bytes(header.tobuf(format=tarfile.GNU_FORMAT) + bytes(4096))
    growth, message = _peak_rss_growth_mb(path)
    assert "over 128 MiB" in message and "model.onnx" in message
    assert growth < 50


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "sparse.bin"
    with open(source, "wb") as fh:
        fh.truncate(64 << 20)
        fh.write(b"x")
    path = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(path), "-C", str(tmp_path), "sparse.bin"], check=True)
    assert path.stat().st_size < 1 << 20
    growth, message = _peak_rss_growth_mb(path)
    assert "sparse file" in message and "regular files only" in message
    assert growth < 50


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_link_members_are_refused(tmp_path: Path, link: str) -> None:
    buf = io.BytesIO(tar_bytes({"manifest.json": b"{}"}))
    out = io.BytesIO()
    with tarfile.open(fileobj=buf) as src, tarfile.open(fileobj=out, mode="w") as tar:
        for m in src.getmembers():
            tar.addfile(m, src.extractfile(m))
        info = tarfile.TarInfo("model.onnx")
        info.type = tarfile.SYMTYPE if link == "symlink" else tarfile.LNKTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    path = tmp_path / "links.tar"
    path.write_bytes(out.getvalue())
    with pytest.raises(BundleError, match=r"member 'model.onnx' is a link; a bundle holds regular files only"):
        read_bundle(path)


def test_a_symlink_in_a_bundle_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    os.symlink("/etc/passwd", folder / "model.onnx")
    with pytest.raises(BundleError, match="is a link"):
        read_bundle(folder)


@pytest.mark.parametrize("name", ["/etc/cron.d/x", "../escape", "a/../../b"])
def test_escaping_paths_are_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / "escape.tar"
    path.write_bytes(tar_bytes({name: b"x", "manifest.json": b"{}"}))
    with pytest.raises(BundleError, match="path escapes the bundle"):
        read_bundle(path)


def test_too_many_members_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "many.tar"
    path.write_bytes(tar_bytes({f"f{i}": b"" for i in range(600)}))
    with pytest.raises(BundleError, match="more than 512 members"):
        read_bundle(path)


def test_a_compressed_real_bundle_still_loads(tmp_path: Path) -> None:
    """The rules refuse bombs, not bundles: a real signed bundle, gzipped or xz-ed, reads as before."""
    real = Path(__file__).parents[1] / "data" / "digits-v1-2026-11.tar"
    for name, pack in (("b.tar.gz", gzip.compress), ("b.tar.xz", lzma.compress)):
        packed = tmp_path / name
        packed.write_bytes(pack(real.read_bytes()))
        assert read_bundle(packed).files == read_bundle(real).files
