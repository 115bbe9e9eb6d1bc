"""What every route of the HTTP API shares: the server's state and who is asking."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from server.llm.completions import LlmService
from server.mqtt.bridge import Bridge, Metrics
from server.store.store import Device, Store


@dataclass
class Principal:
    """Who sent a request: the admin, or a registered device."""

    admin: bool
    device: Device | None


@dataclass
class ServerState:
    """The server's parts the routes use: the store, the keys and tokens it trusts, the bridge, the
    language model and the job workers."""

    store: Store
    admin_token: str
    bundle_dir: Path
    trusted_keys: list[Ed25519PublicKey]
    metrics: Metrics
    bridge: Bridge | None = None
    broker_url: str = ""  # what devices connect to (reported at /healthz)
    llm: LlmService | None = None  # a language model served at /v1/completions (trickle serve --llm)
    llm_open: bool = False  # the LLM routes without an API key (trickle serve --llm-open)
    changes: int = 0  # registrations, uploads and assignments so far (the dashboard's stream pushes on each)
    workers: Callable[[], tuple[int, int]] | None = None  # (alive, wanted) job worker processes (/readyz)
    # called with a device's name when its token is rotated or revoked (the embedded broker closes its connections)
    on_token_revoked: list[Callable[[str], object]] = field(default_factory=list)
