"""TLS end to end: a CA and certificates made with ``cryptography``; Mosquitto with a TLS listener
that requires client certificates; ``trickle serve`` over HTTPS whose bridge reaches that broker
over mqtts:// with its own certificate; an agent reports through both with its certificate. A
client whose certificate the CA did not sign, or none, is refused by the broker; a client that does
not trust the CA refuses the server."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edge.contract.protocol import TlsFiles
from server.ports import free_port, port_open
from tests.server.conftest import Bundles, needs_mosquitto, wait_for


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(folder: Path, name: str) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert


def make_leaf(folder: Path, name: str, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, server: bool
              ) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                                     x509.DNSName("localhost")]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path



def _mqtt_connects(port: int, tls: TlsFiles) -> bool:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"probe-{free_port()}")
    client.tls_set_context(tls.context())
    try:
        client.connect("127.0.0.1", port, keepalive=5)
        for _ in range(50):  # the broker's verdict on the certificate comes with the handshake's end
            client.loop(0.1)
            if client.is_connected():
                return True
        return False
    except (ssl.SSLError, OSError):
        return False
    finally:
        client.disconnect()


@needs_mosquitto
def test_an_agent_reports_over_mqtts_and_https_and_untrusted_clients_are_refused(bundles: Bundles, tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    ca_path, ca_key, ca = make_ca(pki, "trickle-ca")
    rogue_path, rogue_key, rogue = make_ca(pki, "rogue-ca")
    broker_cert, broker_key = make_leaf(pki, "broker", ca_key, ca, server=True)
    https_cert, https_key = make_leaf(pki, "https", ca_key, ca, server=True)
    bridge_cert, bridge_key = make_leaf(pki, "bridge", ca_key, ca, server=False)
    node_cert, node_key = make_leaf(pki, "node-t", ca_key, ca, server=False)
    forged_cert, forged_key = make_leaf(pki, "forged", rogue_key, rogue, server=False)

    mqtt_port, http_port = free_port(), free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {mqtt_port} 127.0.0.1\ncafile {ca_path}\ncertfile {broker_cert}\nkeyfile {broker_key}\n"
                    "require_certificate true\nallow_anonymous true\n" + ("user root\n" if os.geteuid() == 0 else ""))
    broker = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        wait_for(lambda: port_open(mqtt_port), 10, "mosquitto")
        # the broker refuses a certificate its CA did not sign, and a client without one
        assert not _mqtt_connects(mqtt_port, TlsFiles(ca_path, forged_cert, forged_key))
        assert not _mqtt_connects(mqtt_port, TlsFiles(ca_path))
        assert _mqtt_connects(mqtt_port, TlsFiles(ca_path, node_cert, node_key))

        state = tmp_path / "server"
        cmd = [sys.executable, "-m", "trickle", "serve", "--state-dir", str(state), "--port", str(http_port),
               "--broker", f"mqtts://127.0.0.1:{mqtt_port}", "--broker-ca-file", str(ca_path),
               "--broker-cert", str(bridge_cert), "--broker-key", str(bridge_key),
               "--tls-cert", str(https_cert), "--tls-key", str(https_key), "--trust", str(bundles.pub)]
        log = tmp_path / "serve.log"
        with open(log, "wb") as out:
            server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        url = f"https://127.0.0.1:{http_port}"
        trusted = TlsFiles(ca_path).context()

        def healthy() -> bool:
            assert server is not None and server.poll() is None, log.read_text()[-3000:]
            try:
                return bool(httpx.get(url + "/healthz", verify=trusted, timeout=2).json()["broker_connected"])
            except httpx.HTTPError:
                return False

        wait_for(healthy, 60, "the server over HTTPS, its bridge connected over mqtts")
        # a client that does not trust the server's CA refuses it
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/healthz", verify=TlsFiles(rogue_path).context(), timeout=5)
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        r = httpx.post(url + "/v1/devices", json={"device": "node-t", "fleet": "f"}, headers=admin, verify=trusted)
        r.raise_for_status()
        token = tmp_path / "node-t.token"
        token.write_text(r.json()["token"])
        # a newer bundle assigned before the agent starts: it downloads it over HTTPS
        up = httpx.post(url + "/v1/bundles", content=bundles.v2.read_bytes(), headers=admin, verify=trusted, timeout=60)
        assert up.status_code == 201, up.text
        httpx.post(url + "/v1/assignments", json={"target": "device:node-t", "bundle_version": 2}, headers=admin,
                   verify=trusted).raise_for_status()
        agent = [sys.executable, "-m", "trickle", "edge", "run", "--device-id", "node-t", "--fleet", "f", "--token-file",
                 str(token), "--server", url, "--broker", f"mqtts://127.0.0.1:{mqtt_port}", "--bundle", str(bundles.v1),
                 "--state-dir", str(tmp_path / "agent"), "--source", str(bundles.source), "--count", "20",
                 "--trust", str(bundles.pub), "--ca-file", str(ca_path), "--client-cert", str(node_cert),
                 "--client-key", str(node_key)]
        with open(tmp_path / "agent.log", "wb") as agent_log:
            proc = subprocess.Popen(agent, stdout=subprocess.DEVNULL, stderr=agent_log)

        def results() -> list[dict]:
            return list(httpx.get(url + "/v1/devices/node-t/result", headers=admin, verify=trusted).json())

        try:
            wait_for(lambda: len(results()) >= 20, 120, "20 results over mqtts")
            events = httpx.get(url + "/v1/devices/node-t/event", headers=admin, verify=trusted).json()
            wait_for(lambda: any(e["event"] == "ota_applied" and e["bundle_version"] == 2 for e in
                                 httpx.get(url + "/v1/devices/node-t/event", headers=admin, verify=trusted).json()),
                     60, f"the OTA over HTTPS (events so far: {events})")
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(30)
        broker.terminate()
        broker.wait(10)
