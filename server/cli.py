"""Serve the trickle server: HTTP API + MQTT bridge (+ the embedded broker by default).

    trickle serve                                   # http://127.0.0.1:8080, broker on 127.0.0.1:1883
    trickle serve --broker mqtt://127.0.0.1:1883    # an external broker (e.g. Mosquitto)
    trickle serve --data runs/server --trust keys/signing.pub --port 8443 --tls-cert c.pem --tls-key k.pem

The admin token is in DATA/admin.token (created on first start, mode 0600): register devices
with it (POST /v1/devices {"device": ID, "fleet": NAME} returns the device's token), upload
signed bundles (POST /v1/bundles, the tar as the body) and assign them (POST /v1/assignments);
the OpenAPI spec is at /openapi.json, metrics at /metrics.

Security: devices authenticate to the embedded broker with their id and token and may only
publish and subscribe under their own topics; behind an external broker, configure its ACL the
same way (see edge.protocol.device_topics) — the bridge checks every message's HMAC signature
regardless. TLS: --tls-cert/--tls-key serve HTTPS (uvicorn); for MQTT over TLS use an external
broker with a TLS listener (Mosquitto: listener 8883 + cafile/certfile/keyfile).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

USER_ERRORS = (ValueError, OSError)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=Path("runs/server"), help="database, bundles, tokens (default runs/server)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    p.add_argument("--broker", default="embedded", help="'embedded' (default) or mqtt://HOST:PORT of an external broker")
    p.add_argument("--mqtt-host", default="127.0.0.1", help="embedded broker address (default 127.0.0.1)")
    p.add_argument("--mqtt-port", type=int, default=1883, help="embedded broker port (default 1883)")
    p.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                   help="accept only bundles signed by this Ed25519 public key (repeatable)")
    p.add_argument("--tls-cert", type=Path, help="PEM certificate: serve HTTPS")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")


def run(args: argparse.Namespace) -> int:
    from server.service import ServeConfig, Service

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("amqtt").setLevel(logging.WARNING)
    logging.getLogger("transitions").setLevel(logging.WARNING)
    config = ServeConfig(data_dir=args.data, host=args.host, port=args.port, broker=args.broker, mqtt_host=args.mqtt_host,
                         mqtt_port=args.mqtt_port, trusted_keys=args.trust, tls_cert=args.tls_cert, tls_key=args.tls_key)
    service = Service(config)
    print(f"trickle server on {config.url} (admin token in {args.data / 'admin.token'}), "
          f"MQTT {config.broker_url}{' (embedded)' if args.broker == 'embedded' else ''}", flush=True)
    service.run()
    return 0
