"""Build a bundle's int8 variants as C99 firmware, flash it to a board, run the test vectors.

    trickle flash bundles/digits.tar --board mps2-an386      # Cortex-M4 under QEMU
    trickle flash bundles/digits.tar --board host --vectors 20
    trickle flash bundles/digits.tar --record bundles/digits-m4.tar --key keys/signing.key

Generates C (weights, TFLite-style requantization, descriptors, test vectors) into
OUT/generated, builds it with the board's toolchain, runs every test vector of every 8-bit
variant and checks the int32 logits bit for bit against onnxruntime's integer graph. For
mps2-an386 it prints instructions per inference (counted by the project's QEMU plugin) and
the code size, and leaves OUT/mps2-an386/firmware.elf and firmware.bin for a real board.
With --record, a profiling build also splits each variant's count into its layers, and a copy
of the bundle with those counts in its manifest (bundle_version + 1, signed with --key) is
written for the simulator's cost model (workload.bundle).
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
    p.add_argument("--record", type=Path, metavar="OUT",
                   help="mps2-an386: write a copy of the bundle to OUT (folder, or .tar) whose manifest carries the "
                        "instructions measured per variant and per layer, bundle_version + 1; the simulator's cost "
                        "model uses them (workload.bundle)")
    p.add_argument("--key", type=Path, metavar="PRIVATE", help="with --record: sign the copy with this key")


def run(args: argparse.Namespace) -> int:
    from edge.bundle import load_private_key, load_public_key, read_bundle
    from export.flash import flash, record
    from models.datasets import load

    keys = [load_public_key(k) for k in args.trust]
    bundle = read_bundle(args.bundle, keys or None, require_signature=bool(keys))
    if args.vectors is not None and args.vectors < 1:
        raise FlashError(f"--vectors {args.vectors}: must be >= 1")
    if args.record is not None and args.board != "mps2-an386":
        raise FlashError("--record needs --board mps2-an386 (instructions are counted under QEMU)")
    if args.key is not None and args.record is None:
        raise FlashError("--key signs the --record copy; give --record OUT")
    private = load_private_key(args.key) if args.key is not None else None
    data = load(bundle.manifest["task"], args.data)
    report = flash(bundle, data.x_test, args.board, args.out, args.vectors, profile=args.record is not None)
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
    for v in report["variants"]:
        if "layers" in v:
            split = ", ".join(f"{layer['name']} {layer['instructions']}" for layer in v["layers"])
            print(f"  {v['name']} per layer (vector 0): {split}")
    if args.record is not None and report["mismatches"] == 0:
        print(f"  recorded the counts in {record(bundle, report, args.record, private)}")
    verdict = "bit-exact with onnxruntime" if report["mismatches"] == 0 else f"{report['mismatches']} logits DIFFER"
    print(f"  outputs: {verdict}")
    return 0 if report["mismatches"] == 0 else 1
