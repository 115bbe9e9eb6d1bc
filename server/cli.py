"""Serve the trickle server: HTTP API + MQTT bridge (+ the embedded broker by default).

    trickle serve                                   # http://127.0.0.1:8080, broker on 127.0.0.1:1883
    trickle serve --broker mqtt://127.0.0.1:1883    # an external broker (e.g. Mosquitto)
    trickle serve --state-dir runs/server --trust keys/signing.pub --port 8443 --tls-cert c.pem --tls-key k.pem
    trickle serve --config serve.toml --set port=8443 --json
    trickle serve --llm runs/lm/base --draft runs/lm/draft --llm-key alice   # + the OpenAI API (/v1/chat/completions …)

Options: defaults < the --config file (TOML, keys are the fields of server.service.ServeConfig:
state_dir, store, host, port, broker, mqtt_host, mqtt_port, trusted_keys, admin_token, tls_cert,
tls_key, replica, llm, llm_draft, llm_draft_k, llm_decoding, llm_adaptive_k, llm_tree, llm_concurrency, llm_queue, llm_open,
llm_keys, workers, job_stale_s, job_attempts)
< the flags given < --set FIELD=VALUE items (the value in TOML syntax).

The admin token is in STATE_DIR/admin.token (created on first start, mode 0600): register devices
with it (POST /v1/devices {"device": ID, "fleet": NAME} returns the device's token), upload
signed bundles (POST /v1/bundles, the tar as the body) and assign them (POST /v1/assignments);
the OpenAPI spec is at /openapi.json, metrics at /metrics.

The language model (--llm) speaks the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models)
to holders of an API key: --llm-key NAME makes one at start (in STATE_DIR/llm-keys/NAME.key), or
the admin does (POST /v1/llm/keys {"name": NAME}; GET lists them with their use; DELETE
/v1/llm/keys/NAME revokes); --llm-open serves anyone without a key.

Jobs: POST /v1/jobs queues heavy work (kind distill: MDSLR-pruned distillation into a
quarter-width switchable student, exported as a bundle signed with STATE_DIR/signing.key,
registered and optionally assigned to a fleet); --workers N runs them here, or `trickle worker`
elsewhere on the same state dir and store. Devices that should take those bundles trust
STATE_DIR/signing.pub.

Security: devices authenticate to the embedded broker with their id and token and may only
publish and subscribe under their own topics; behind Mosquitto, `trickle serve
--write-mosquitto-config DIR` writes its password file and ACL from the registry (each device
confined to its own topics, the bridge to all) — the bridge checks every message's HMAC
signature regardless. Data: SQLite in --state-dir, or --store postgresql://... .
TLS: --tls-cert/--tls-key serve HTTPS (uvicorn); for MQTT over TLS use an external
broker with a TLS listener (Mosquitto: listener 8883 + cafile/certfile/keyfile).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    # no defaults here (None: not given), so a --config file's values are not overridden; the
    # defaults are ServeConfig's, named in each help text
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file whose keys are the server's config fields")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="set one config field, the value in TOML syntax (repeatable; overrides the file and the flags)")
    p.add_argument("--state-dir", type=Path, help="database, uploaded bundles, tokens (default runs/server)")
    p.add_argument("--store", metavar="URL", help="postgresql://USER[:PASSWORD]@HOST:PORT/DB: keep the data in "
                                                  "PostgreSQL (schema migrations applied at start; default: SQLite "
                                                  "in --state-dir)")
    p.add_argument("--host", help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8080)")
    p.add_argument("--broker", help="'embedded' (default), or mqtt://HOST:PORT or mqtts://HOST:PORT (TLS) of an "
                                    "external broker")
    p.add_argument("--broker-ca-file", type=Path, metavar="PEM",
                   help="CA certificates the bridge trusts for an mqtts:// --broker (default: the system's)")
    p.add_argument("--broker-cert", type=Path, metavar="PEM",
                   help="certificate the bridge shows an mqtts:// broker that asks for one (mutual TLS)")
    p.add_argument("--broker-key", type=Path, metavar="PEM", help="the private key of --broker-cert")
    p.add_argument("--replica", action="append", metavar="NAME", dest="replicas",
                   help="run as replica NAME of several trickle serve processes sharing one --store postgresql://..., "
                        "one external --broker (shared subscriptions: each message goes to one replica) and one "
                        "--state-dir; with --write-mosquitto-config, name every replica (repeatable) so each may log in")
    p.add_argument("--mqtt-host", help="embedded broker address (default 127.0.0.1)")
    p.add_argument("--mqtt-port", type=int, help="embedded broker port (default 1883)")
    p.add_argument("--trust", type=Path, action="append", metavar="PUBKEY",
                   help="accept only bundles signed by this Ed25519 public key (repeatable)")
    p.add_argument("--tls-cert", type=Path, help="PEM certificate: serve HTTPS (with --tls-key)")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument("--llm", type=Path, metavar="DIR",
                   help="serve this Hugging Face causal LM folder (save_pretrained) at POST /v1/completions")
    p.add_argument("--draft", type=Path, metavar="DIR",
                   help="a smaller causal LM with the same tokenizer: speculative decoding inside (with --llm)")
    p.add_argument("--draft-k", type=int, metavar="K",
                   help="draft tokens per target call (default 4; the most with auto decoding or --adaptive-k)")
    p.add_argument("--decoding", choices=["auto", "chain"],
                   help="auto (default): each round drafts the K in 0..--draft-k that measured costs say is fastest, "
                        "0 (plain decoding) included; chain: always --draft-k")
    p.add_argument("--adaptive-k", action="store_true", default=None,
                   help="choose each call's draft length from the running acceptance rate")
    p.add_argument("--tree", metavar="DxBxW",
                   help="tree drafting: D levels, B children per expanded node, W nodes expanded per level (e.g. 5x2x3)")
    p.add_argument("--llm-concurrency", type=int, metavar="N", help="generations run at once (default 1)")
    p.add_argument("--llm-queue", type=int, metavar="N",
                   help="requests waiting for a generation slot; beyond, 503 (default 16)")
    p.add_argument("--llm-key", action="append", metavar="NAME", dest="llm_keys",
                   help="make the API key NAME for the LLM routes at start if missing, in STATE_DIR/llm-keys/NAME.key "
                        "(repeatable; more with POST /v1/llm/keys as the admin)")
    p.add_argument("--llm-open", action="store_const", const=True,
                   help="serve the LLM routes to anyone, without an API key")
    p.add_argument("--workers", type=int, metavar="N",
                   help="start N worker processes for jobs (POST /v1/jobs: distillation); a dead one is replaced and "
                        "its job resumed (default 0: run `trickle worker` beside the server)")
    p.add_argument("--write-mosquitto-config", type=Path, metavar="DIR",
                   help="write a Mosquitto password file, ACL (each device confined to its own topics) and the "
                        "configuration lines using them into DIR from the device registry, then exit (include "
                        "DIR/mosquitto.conf in the broker's config; write again and SIGHUP it after registering)")
    p.add_argument("--json", action="store_true", help="print the start-up line as one JSON object")


def run(args: argparse.Namespace) -> int:
    from edge.core.config import load_config
    from server.service import ServeConfig, Service

    flags = {"state_dir": args.state_dir, "store": args.store, "broker_ca_file": args.broker_ca_file,
             "broker_cert": args.broker_cert, "broker_key": args.broker_key, "host": args.host, "port": args.port,
             "broker": args.broker,
             "mqtt_host": args.mqtt_host, "mqtt_port": args.mqtt_port, "trusted_keys": args.trust,
             "tls_cert": args.tls_cert, "tls_key": args.tls_key, "llm": args.llm, "llm_draft": args.draft,
             "llm_draft_k": args.draft_k, "llm_decoding": args.decoding, "llm_adaptive_k": args.adaptive_k, "llm_tree": args.tree,
             "llm_concurrency": args.llm_concurrency, "llm_queue": args.llm_queue, "llm_open": args.llm_open,
             "llm_keys": args.llm_keys, "workers": args.workers}
    replicas = args.replicas or []
    if len(replicas) > 1 and args.write_mosquitto_config is None:
        from edge.core.errors import ConfigError

        raise ConfigError("replica", ", ".join(replicas), "a server is one replica: give --replica once "
                          "(several only with --write-mosquitto-config, to let each log in)")
    flags["replica"] = replicas[0] if len(replicas) == 1 else None
    config = load_config(ServeConfig, args.config, args.set, flags)
    if args.write_mosquitto_config is not None:
        from server.mqtt.mosquitto import write_mosquitto_config
        from server.service import read_or_create_token
        from server.store.store import open_store

        store = open_store(config.store or config.state_dir / "trickle.sqlite")
        paths = write_mosquitto_config(store, read_or_create_token(config.state_dir / "server.token"),
                                       args.write_mosquitto_config, replicas=replicas)
        devices = len(store.devices())
        if args.json:
            print(json.dumps({"written": [str(p) for p in paths], "devices": devices}))
        else:
            bridges = f"{len(replicas)} replicas' bridges" if replicas else "the server's bridge"
            print(f"wrote {', '.join(str(p) for p in paths)} ({devices} devices and {bridges})")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("amqtt").setLevel(logging.WARNING)
    logging.getLogger("transitions").setLevel(logging.WARNING)
    service = Service(config)
    token_file = None if config.admin_token else config.state_dir / "admin.token"
    embedded = config.broker == "embedded"
    if args.json:
        print(json.dumps({"url": config.url, "broker": config.broker_url, "embedded_broker": embedded,
                          "state_dir": str(config.state_dir), "admin_token_file": str(token_file) if token_file else None,
                          "llm": str(config.llm) if config.llm else None}),
              flush=True)
    else:
        print(f"trickle server on {config.url} (admin token in {token_file or 'the config'}), "
              f"MQTT {config.broker_url}{' (embedded)' if embedded else ''}"
              + (f", {config.llm} at {config.url}/v1 (OpenAI API, "
                 f"{'open to anyone' if config.llm_open else 'API keys in ' + str(config.state_dir / 'llm-keys')})"
                 if config.llm else ""), flush=True)
    service.run()
    return 0


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", type=Path, default=Path("runs/server"),
                   help="the server's state dir: its SQLite database (without --store), bundles, signing key "
                        "(default runs/server)")
    p.add_argument("--store", metavar="URL",
                   help="postgresql://...: the server's PostgreSQL store (default $TRICKLE_STORE, where a password "
                        "stays out of the process list)")
    p.add_argument("--once", action="store_true", help="run the queued jobs, then exit")
    p.add_argument("--parent-pid", type=int, metavar="PID", help=argparse.SUPPRESS)  # trickle serve --workers: exit with it


def run_worker(args: argparse.Namespace) -> int:
    """Run the server's queued jobs, one at a time, until SIGTERM/SIGINT (a running job is handed back).

        trickle worker --state-dir runs/server
        trickle worker --state-dir /shared/server --store postgresql://trickle@db:5432/trickle

    `trickle serve --workers N` starts N of these itself. A worker on another machine needs the
    server's store (--store) and its state dir (bundles, signing key) on a shared file system.
    Progress and logs: GET /v1/jobs/{id} and /v1/jobs/{id}/logs.
    """
    from server.jobs.queue import run_worker as work
    from server.jobs.queue import signing_key
    from server.store.store import open_store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    store = open_store(args.store or os.environ.get("TRICKLE_STORE") or args.state_dir / "trickle.sqlite")
    signing_key(args.state_dir)
    work(store, args.state_dir, once=args.once, parent_pid=args.parent_pid)
    return 0
