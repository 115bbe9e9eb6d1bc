"""Make an Ed25519 key pair for signing bundles (trickle's key file format, see edge/bundle.py).

    trickle keygen keys/            # writes keys/signing.key (mode 0600) and keys/signing.pub
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edge.bundle import BundleError, generate_keypair

USER_ERRORS = (BundleError,)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path, help="where to write signing.key and signing.pub")
    p.add_argument("--force", action="store_true", help="overwrite an existing key pair")


def run(args: argparse.Namespace) -> int:
    private, public = args.folder / "signing.key", args.folder / "signing.pub"
    if private.exists() and not args.force:
        raise BundleError(f"{private} exists; pass --force to replace it (bundles it signed will no longer verify)")
    generate_keypair(private, public)
    print(f"wrote {private} (keep it secret) and {public} (give it to devices)")
    return 0
