"""Mosquitto's password file and ACL from the device registry (``trickle serve --write-mosquitto-config DIR``).

Each device may publish only to its own topics and subscribe only to the server's topics for it
(``edge.protocol.device_topics``); the server's bridge (user ``trickle-server``, its token from
the state folder) may read and write every trickle topic. Passwords are the tokens, hashed as
``mosquitto_passwd`` hashes them (PBKDF2-HMAC-SHA512, ``$7$`` format). Writes three files:

- ``passwords``: ``user:$7$ITERATIONS$SALT$HASH`` per line, mode 0600;
- ``acl``: a ``user`` block per account with its ``topic read|write|readwrite`` lines;
- ``mosquitto.conf``: the lines that use them (``allow_anonymous false``, ``password_file``,
  ``acl_file``), to include in a broker's configuration beside its listeners.

Registering a device later needs the files written again and Mosquitto told (SIGHUP reloads both).
The password file is 0600: make it readable by the user Mosquitto runs as (``chown mosquitto``).
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from edge.files import write_atomic, write_secret
from edge.protocol import ROOT, device_topics
from server.bridge import SERVER_USER
from server.store import Store

ITERATIONS = 101  # mosquitto_passwd's default


def password_line(user: str, password: str, salt: bytes | None = None) -> str:
    """One line of a Mosquitto 2 password file."""
    salt = os.urandom(12) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
    return f"{user}:$7${ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def acl_text(store: Store) -> str:
    blocks = [f"# written by trickle serve --write-mosquitto-config\nuser {SERVER_USER}\ntopic readwrite {ROOT}/#\n"]
    for record in store.devices():
        topics = device_topics(record["fleet"], record["device"])
        lines = [f"user {record['device']}"]
        lines += [f"topic write {t}" for t in topics["publish"]]
        lines += [f"topic read {t}" for t in topics["subscribe"]]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def write_mosquitto_config(store: Store, server_token: str, folder: Path) -> list[Path]:
    """Write the password file, the ACL and the configuration lines for the registry's devices."""
    folder.mkdir(parents=True, exist_ok=True)
    passwords = [password_line(SERVER_USER, server_token)]
    for record in store.devices():
        device = store.device(record["device"])
        assert device is not None
        passwords.append(password_line(device.device, device.token))
    paths = [folder / "passwords", folder / "acl", folder / "mosquitto.conf"]
    write_secret(paths[0], "\n".join(passwords) + "\n")
    write_atomic(paths[1], acl_text(store))
    write_atomic(paths[2], f"# include beside your listeners\nallow_anonymous false\npassword_file {paths[0].resolve()}\n"
                           f"acl_file {paths[1].resolve()}\n")
    return paths
