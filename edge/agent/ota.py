"""The device's bundles and over-the-air updates: boot, download, verify, switch, self-test, roll back.

    ota = Ota(state_dir, trust=[Path("keys/signing.pub")], backend="onnxruntime", server="http://127.0.0.1:8080",
              token=token, outbox=outbox, first_bundle=Path("bundles/digits.tar"), report=report, applied=applied)
    bundle, runtime = ota.current     # what the device runs now
    ota.handle(payload)               # an OtaCommand from the device's ota topic (the link's on_ota)

The state folder holds ``bundles/v{N}[.tar]`` and ``current.json`` (``{"path": "bundles/vN.tar"}``),
always replaced atomically (``edge.core.files.write_atomic``), so a power cut leaves the old bundle
or the new one, never neither. Every bundle is loaded with ``edge.contract.bundle.read_trusted``: with
trusted keys, it must be signed by one of them.

An update (the server retains an ``OtaCommand`` on the device's ``ota`` topic): the bundle is
downloaded over HTTP (a dropped connection is retried, bounded), its sha256 checked against
the command's, then its signature, every file hash and that its version is newer than the
running one; ``current.json`` is switched to it and it is self-tested: on the test vectors the
bundle carries (``Runtime.self_test``), or, for a bundle exported before those existed, on
the first samples of the agent's source (``edge.agent.source``). A failed self-test switches back
and is remembered, so the retained command is not tried again. Each outcome is reported
(``report(event, bundle_version, detail)``): ``ota_applied``, ``ota_rolled_back`` or
``ota_rejected``; nothing wrong with an update is fatal to the agent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import ssl
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import numpy as np
from tenacity import before_sleep_log, retry, retry_if_exception_type, stop_after_attempt, wait_fixed

from edge.agent.outbox import Outbox
from edge.agent.source import stored_selftest_samples
from edge.classify.runtime import Runtime
from edge.contract.bundle import Bundle, read_trusted
from edge.contract.protocol import OtaCommand
from edge.core.errors import BundleError, ConfigError, DataError, TrickleError
from edge.core.files import write_atomic

log = logging.getLogger("trickle.edge.ota")
CURRENT = "current.json"
# the fallback self-test (a bundle without test vectors, on the source's stored samples): the
# accuracy there may fall this far below what the manifest claims
STORED_SAMPLES_SLACK = 0.25
MAX_DOWNLOAD_BYTES = 64 << 20  # the server's own cap on an uploaded bundle


def self_test(runtime: Runtime, state_dir: Path) -> str | None:
    """None if ``runtime`` passes its self-test, else why not.

    With test vectors in the bundle, the self-test is ``Runtime.self_test`` (every variant
    against the outputs export recorded). Without (an older bundle), the most accurate variant
    on the samples kept from the source: every output finite and, with labels, accuracy within
    ``STORED_SAMPLES_SLACK`` of what the manifest claims; no samples kept yet passes."""
    try:
        report = runtime.self_test()
    except (TrickleError, ValueError, RuntimeError) as err:
        return f"inference failed on the bundle's test vectors: {err}"
    if report is not None:
        return None if report.passed else "; ".join(report.failures)
    stored = stored_selftest_samples(state_dir)
    if stored is None:
        return None
    x, y = stored
    try:
        variant = runtime.choose()
        logits = np.concatenate([runtime.infer(raw, variant.name) for raw in x])
    except (TrickleError, ValueError, RuntimeError) as err:
        return f"inference failed: {err}"
    if not np.all(np.isfinite(logits)):
        return "non-finite outputs"
    if y is not None:
        accuracy = float((logits.argmax(1) == y).mean())
        claimed = variant.accuracy.get(runtime.format_of(variant))  # unmeasured (a model imported without labels)
        if claimed is not None and accuracy < claimed - STORED_SAMPLES_SLACK:
            return f"accuracy {accuracy:.2f} on the stored vectors, the manifest claims {claimed:.2f}"
    return None


@retry(retry=retry_if_exception_type(httpx.TransportError), stop=stop_after_attempt(3), wait=wait_fixed(2.0),
       before_sleep=before_sleep_log(log, logging.WARNING), reraise=True)
def download(url: str, token: str, verify: ssl.SSLContext | bool = True, max_bytes: int = MAX_DOWNLOAD_BYTES) -> bytes:
    """The body of ``url`` (the device's bearer token), at most ``max_bytes`` (BundleError past
    them, read no further); a dropped or refused connection is tried three times, an HTTP error
    status is not retried. ``verify``: how an https:// server is checked."""
    with httpx.stream("GET", url, headers={"Authorization": f"Bearer {token}"}, timeout=60.0, verify=verify) as response:
        response.raise_for_status()
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise BundleError(f"{url}: the download is over {max_bytes >> 20} MiB (refused)")
            chunks.append(chunk)
    return b"".join(chunks)


class Ota:
    """The bundle a device runs, and the updates that replace it."""

    def __init__(self, state_dir: Path, trust: Sequence[Path], backend: str, server: str, token: str,
                 outbox: Outbox, first_bundle: Path | None = None,
                 report: Callable[[str, int | None, str], None] | None = None,
                 applied: Callable[[int], None] | None = None, verify: ssl.SSLContext | bool = True) -> None:
        self.state_dir, self.trust, self.backend = Path(state_dir), list(trust), backend
        self.verify = verify  # how an https:// server is checked
        self.server, self.token, self.outbox = server, token, outbox
        self.report = report or (lambda event, version, detail: None)
        self.applied = applied or (lambda version: None)
        self._lock = threading.Lock()
        bundle = self._boot(first_bundle)
        self._current = (bundle, Runtime(bundle, backend=backend))

    @property
    def current(self) -> tuple[Bundle, Runtime]:
        """The bundle running now and its runtime (one pair: an update replaces both at once)."""
        return self._current

    @property
    def version(self) -> int:
        return self._current[0].manifest.bundle_version

    # ---- the state folder ----

    def _boot(self, first: Path | None) -> Bundle:
        current = self.state_dir / CURRENT
        if current.exists():
            return read_trusted(self.state_dir / self._current_name(), self.trust)
        if first is None:
            raise ConfigError("--bundle", None, f"{self.state_dir} holds no bundle yet: give the first bundle")
        bundle = read_trusted(first, self.trust)
        name = f"bundles/v{bundle.manifest.bundle_version}{'.tar' if first.suffix == '.tar' else ''}"
        target = self.state_dir / name
        if first.is_dir():
            shutil.copytree(first, target, dirs_exist_ok=True)
        else:
            write_atomic(target, first.read_bytes())
        self.switch(name)
        return bundle

    def switch(self, name: str) -> None:
        """Make ``name`` (relative to the state folder) the bundle a restart boots, atomically."""
        write_atomic(self.state_dir / CURRENT, json.dumps({"path": name}))

    def _current_name(self) -> str:
        """The bundle current.json names (inside the state folder); DataError naming the file and
        the way out when it is damaged."""
        path = self.state_dir / CURRENT
        try:
            name = json.loads(path.read_text())["path"]
            if not isinstance(name, str) or not name.startswith("bundles/") or ".." in name.split("/"):
                raise ValueError(f"path {str(name)[:80]!r} is not a bundle in the state folder")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: damaged ({type(err).__name__}: {str(err)[:120]}); delete it and start again with "
                            "--bundle FIRST (the device then runs that bundle and takes its assignment by OTA)") from None
        return name

    # ---- updates ----

    def handle(self, payload: bytes) -> None:
        """An OTA command as the link receives it: applied, or refused and reported; never raises."""
        with self._lock:
            try:
                command = OtaCommand.model_validate_json(payload)
            except ValueError as err:
                log.warning("ignored a malformed OTA command: %s", err)
                return
            if command.bundle_version == self.version or self.outbox.get_state(f"failed:{command.bundle_version}"):
                return  # already running it, or its self-test failed here before (the command is retained)
            try:
                self.apply(command)
            except Exception as err:  # anything wrong with an update is reported, never fatal to the agent
                log.warning("OTA to v%d refused: %s", command.bundle_version, err)
                self.report("ota_rejected", command.bundle_version, str(err))

    def apply(self, command: OtaCommand) -> None:
        """Download, verify, switch to, and self-test the bundle of ``command``; roll back if the
        self-test fails. A bundle that fails verification raises (BundleError, httpx errors)."""
        old_version = self.version
        if command.bundle_version < old_version:
            raise BundleError(f"bundle_version {command.bundle_version} is older than the running {old_version}")
        content = download(self.server.rstrip("/") + command.path, self.token, self.verify)
        if hashlib.sha256(content).hexdigest() != command.sha256:
            raise BundleError(f"downloaded bundle v{command.bundle_version} does not match the sha256 the server announced")
        name = f"bundles/v{command.bundle_version}.tar"
        target = write_atomic(self.state_dir / name, content)
        try:
            bundle = read_trusted(target, self.trust, newer_than=old_version)
        except BundleError:
            target.unlink(missing_ok=True)  # a refused bundle leaves nothing behind
            raise
        previous = self._current_name()
        self.switch(name)
        try:
            runtime = Runtime(bundle, backend=self.backend)
            failure = self_test(runtime, self.state_dir)
        except Exception as err:  # a bundle this backend cannot run fails its self-test
            failure = str(err)
        if failure is not None:
            self.switch(previous)
            self.outbox.set_state(f"failed:{command.bundle_version}", failure)  # not retried when the command is retained
            log.warning("OTA to v%d rolled back: %s", command.bundle_version, failure)
            self.report("ota_rolled_back", command.bundle_version, f"self-test failed: {failure}; running v{old_version}")
            return
        self._current = (bundle, runtime)
        self.applied(self.version)
        log.info("OTA: now running v%d", self.version)
        self.report("ota_applied", self.version, f"from v{old_version}")

