"""Export a trained checkpoint as a bundle, every variant in every format, parity-checked.

    trickle export runs/train/digits-nexume/checkpoint.pt --out bundles/digits --key keys/signing.key
    trickle export CHECKPOINT --out bundles/digits.tar --tar --formats onnx-int8

Formats: onnx (fp32), onnx-int8 (QDQ; brevitas' QCDQ export of the quantized variants),
pte (ExecuTorch, XNNPACK-delegated and portable, of the float variants), tflite (litert-torch,
of the float variants). The same checkpoint and options give byte-identical files. Export
stops with one error line when a format's runtime misses parity with PyTorch (fp32: max abs
diff <= 1e-4; int8: top-1 agreement >= 99% and accuracy within 1 point). Make a key pair
with `trickle keygen`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edge.bundle import BundleError
from export.bundle import FORMATS, ExportError
from models.datasets import DatasetError

USER_ERRORS = (ExportError, BundleError, DatasetError)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="checkpoint.pt written by trickle train")
    p.add_argument("--out", type=Path, required=True, help="bundle folder (or .tar with --tar)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, among {','.join(FORMATS)}")
    p.add_argument("--key", type=Path, help="Ed25519 private key file to sign the manifest with")
    p.add_argument("--tar", action="store_true", help="write one deterministic tar instead of a folder")
    p.add_argument("--bundle-version", type=int, default=1, help="monotonic version a device checks (default 1)")
    p.add_argument("--data", type=Path, help="shared data folder, for the test split of the parity checks")


def run(args: argparse.Namespace) -> int:
    from export.bundle import export_bundle

    if not args.checkpoint.is_file():
        raise ExportError(f"checkpoint {args.checkpoint}: no such file")
    if args.bundle_version < 1:
        raise ExportError(f"--bundle-version {args.bundle_version}: must be >= 1")
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    path = export_bundle(args.checkpoint, args.out, formats, args.key, args.tar, args.bundle_version, args.data,
                         progress=lambda name: print(f"  {name}: parity ok"))
    print(f"wrote {path}" + (" (signed)" if args.key else " (unsigned)"))
    return 0
