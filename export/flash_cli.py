"""Build a bundle's int8 variants as C99 firmware, flash it to a board, run the test vectors.

    trickle flash bundles/digits.tar --board mps2-an386      # Cortex-M4 under QEMU
    trickle flash bundles/digits.tar --board host --vectors 20

Generates C (weights, TFLite-style requantization, descriptors, test vectors) into
OUT/generated, builds it with the board's toolchain, runs every test vector of every 8-bit
variant and checks the int32 logits bit for bit against onnxruntime's integer graph. For
mps2-an386 it prints instructions per inference (counted by the project's QEMU plugin) and
the code size, and leaves OUT/mps2-an386/firmware.elf and firmware.bin for a real board.
Needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm for mps2-an386.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edge.bundle import BundleError
from export.flash import BOARDS, FlashError
from export.intmodel import IntModelError
from models.datasets import DatasetError

USER_ERRORS = (BundleError, FlashError, IntModelError, DatasetError)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=Path, help="bundle folder or .tar with int8 (onnx-int8) variants")
    p.add_argument("--board", choices=BOARDS, default="mps2-an386", help="target (default mps2-an386)")
    p.add_argument("--out", type=Path, default=Path("build/flash"), help="build folder (default build/flash)")
    p.add_argument("--vectors", type=int, help="run only the first N test vectors")
    p.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                   help="trusted public key file; with one, the bundle must be signed by it")
    p.add_argument("--data", type=Path, help="shared data folder (for fsdd's test vectors)")


def run(args: argparse.Namespace) -> int:
    from edge.bundle import load_public_key, read_bundle
    from export.flash import flash
    from models.datasets import load

    keys = [load_public_key(k) for k in args.trust]
    bundle = read_bundle(args.bundle, keys or None, require_signature=bool(keys))
    if args.vectors is not None and args.vectors < 1:
        raise FlashError(f"--vectors {args.vectors}: must be >= 1")
    data = load(bundle.manifest["task"], args.data)
    report = flash(bundle, data.x_test, args.board, args.out, args.vectors)
    print(f"{bundle.manifest['model']} on {args.board}: {report['vectors']} test vectors x {len(report['variants'])} variants")
    for k, v in enumerate(report["variants"]):
        first = report["outputs"].get((0, k))
        line = f"  {v['name']}: {v['macs']} MACs, vector 0 -> {first[:4]}..." if first else f"  {v['name']}"
        if v.get("instructions_per_inference"):
            line += f", {v['instructions_per_inference']} instructions ({v['instructions_per_mac']:.2f}/MAC)"
        print(line)
    if "size" in report:
        s = report["size"]
        print(f"  size: text {s['text']} B, data {s['data']} B, bss {s['bss']} B (text includes the test vectors)")
        print(f"  wrote {report['binary']} and {report['bin']}")
    verdict = "bit-exact with onnxruntime" if report["mismatches"] == 0 else f"{report['mismatches']} logits DIFFER"
    print(f"  outputs: {verdict}")
    return 0 if report["mismatches"] == 0 else 1
