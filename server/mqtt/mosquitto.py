"""Mosquitto's password file and ACL from the device registry (``trickle serve --write-mosquitto-config DIR``).

Each device may publish only to its own topics and subscribe only to the server's topics for it
(``edge.contract.protocol.device_topics``); the server's bridge (user ``trickle-server``, its token from
the state folder) may read and write every trickle topic. Passwords are the tokens, hashed as
``mosquitto_passwd`` hashes them (PBKDF2-HMAC-SHA512, ``$7$`` format). Writes three files:

- ``passwords``: ``user:$7$ITERATIONS$SALT$HASH`` per line, mode 0600;
- ``acl``: a ``user`` block per account with its ``topic read|write|readwrite`` lines;
- ``mosquitto.conf``: the lines that use them (``allow_anonymous false``, ``use_username_as_clientid
  true``: a client's id is the user it authenticated as, ``password_file``, ``acl_file``) and the
  broker limits (``limits_text``: packet size, in-flight and queued messages), to include in a
  broker's configuration beside its listeners.

Registering a device later needs the files written again and Mosquitto told (SIGHUP reloads both).
The password file is 0600: make it readable by the user Mosquitto runs as (``chown mosquitto``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from edge.contract.protocol import ROOT, device_topics
from edge.core.errors import LinkError
from edge.core.files import write_atomic, write_secret
from server.mqtt.bridge import SERVER_USER, replica_user
from server.mqtt.limits import MAX_PACKET_BYTES, OUTGOING_IN_FLIGHT, QUEUED_BYTES, QUEUED_MESSAGES
from server.store.store import Store

ITERATIONS = 101  # mosquitto_passwd's default


def password_line(user: str, password: str, salt: bytes | None = None) -> str:
    """One line of a Mosquitto 2 password file."""
    salt = os.urandom(12) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
    return f"{user}:$7${ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def acl_text(store: Store, replicas: Sequence[str] = ()) -> str:
    """The ACL: the server's bridge (and each replica's) reads and writes every trickle topic, each
    device only its own."""
    bridges = [SERVER_USER] + [replica_user(name) for name in replicas]
    blocks = ["# written by trickle serve --write-mosquitto-config\n"
              + "".join(f"user {user}\ntopic readwrite {ROOT}/#\n" for user in bridges)]
    for record in store.devices():
        topics = device_topics(record["fleet"], record["device"])
        lines = [f"user {record['device']}"]
        lines += [f"topic write {t}" for t in topics["publish"]]
        lines += [f"topic read {t}" for t in topics["subscribe"]]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def write_mosquitto_config(store: Store, server_token: str, folder: Path, replicas: Sequence[str] = ()) -> list[Path]:
    """Write the password file, the ACL and the configuration lines for the registry's devices
    (and for each replica's bridge, ``trickle-server.NAME``, which logs in with the server token)."""
    folder.mkdir(parents=True, exist_ok=True)
    passwords = [password_line(user, server_token) for user in [SERVER_USER, *(replica_user(r) for r in replicas)]]
    for record in store.devices():
        device = store.device(record["device"])
        assert device is not None
        passwords.append(password_line(device.device, device.token))
    paths = [folder / "passwords", folder / "acl", folder / "mosquitto.conf"]
    write_secret(paths[0], "\n".join(passwords) + "\n")
    write_atomic(paths[1], acl_text(store, replicas))
    # the client id is the authenticated user: no device can take the bridge's session, or another
    # device's, by naming its client id (one MQTT session per device through Mosquitto)
    write_atomic(paths[2], f"# include beside your listeners\nallow_anonymous false\nuse_username_as_clientid true\n"
                           f"password_file {paths[0].resolve()}\nacl_file {paths[1].resolve()}\n" + limits_text())
    return paths


def limits_text() -> str:
    """The broker limits (``server.mqtt.limits``) as Mosquitto 2.0 configuration lines. Every one
    applies to all clients alike (2.0 has no per-user limit nor a message rate): ``max_packet_size``
    is checked on each packet's fixed header, before its body is read and before any login (a 200 MB
    CONNECT had been read whole), and bounds what a device can retain to its six topics x 512 KiB
    (the server's ``ota`` commands are retained, so ``retain_available`` stays on); the queue
    lines size the bridge's backlog (see ``QUEUED_BYTES``). A connection that never sends CONNECT
    is closed by Mosquitto 2.0.11 after 1.5 x its default 60 s keepalive (95 s measured), which no
    option shortens: cap a listener's connections with ``max_connections`` where that matters."""
    return (f"# broker limits (trickle's server/mqtt/limits.py)\nmax_packet_size {MAX_PACKET_BYTES}\n"
            f"max_inflight_messages {OUTGOING_IN_FLIGHT}\nmax_queued_messages {QUEUED_MESSAGES}\n"
            f"max_queued_bytes {QUEUED_BYTES}\n")


class Mosquitto:
    """A Mosquitto on a free loopback port using the files ``write_mosquitto_config`` writes in
    ``folder`` (its own configuration, persistence and log beside them); ``reload`` after writing
    them again (SIGHUP). Used by ``trickle demo`` when Mosquitto is installed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> Mosquitto:
        from server.ports import free_port, port_open

        binary = shutil.which("mosquitto")
        if binary is None:
            raise LinkError("mosquitto not found: apt-get install mosquitto")
        self.port = self.port or free_port()  # a restart keeps its port: clients reconnect to it
        conf = self.folder / "broker.conf"
        run_as = "user root\n" if os.geteuid() == 0 else ""  # as root it would drop to a user that cannot read the files
        write_atomic(conf, f"listener {self.port} 127.0.0.1\n{run_as}" + (self.folder / "mosquitto.conf").read_text())
        with open(self.folder / "mosquitto.log", "ab") as log:
            self.proc = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LinkError(f"mosquitto exited ({self.proc.returncode}); see {self.folder / 'mosquitto.log'}")
            if port_open(self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise LinkError(f"mosquitto did not listen on port {self.port} within {timeout_s:g} s")

    def reload(self) -> None:
        """Read the password file and ACL again (after new devices were written into them)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None
