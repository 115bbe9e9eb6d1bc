"""Bundles and OTA: signed uploads (verified as a device will, streamed to disk under a cap),
downloads, and assignments of a version to a device or a fleet, announced to the devices as a
retained OTA command."""

import logging
import os
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from edge.contract.bundle import BundleError, read_trusted
from edge.contract.protocol import ROUTES, OtaCommand
from server.api.auth import Auth
from server.api.limits import OCTET_STREAM, receive_file
from server.api.state import Principal, ServerState
from server.store.store import Device, StoreError

log = logging.getLogger("trickle.server.http")
MAX_BUNDLE_BYTES = 64 << 20


class BundleOut(BaseModel):
    """An uploaded bundle as the registry lists it."""

    version: int
    model: str
    sha256: str


class AssignmentIn(BaseModel):
    """Which bundle version a device or a fleet should run."""

    target: str = Field(pattern=r"^(device|fleet):[A-Za-z0-9_-]{1,64}$", description="device:ID or fleet:NAME")
    bundle_version: int = Field(ge=1, le=2**62)


class AssignmentOut(BaseModel):
    """An assignment made, and the devices told of it now."""

    target: str
    bundle_version: int
    notified: list[str]


def ota_command(bundle: dict[str, Any]) -> OtaCommand:
    """What a device is told about a bundle (a row of ``Store.bundle``)."""
    return OtaCommand(bundle_version=bundle["version"], sha256=bundle["sha256"],
                      path=ROUTES["bundle"].format(version=bundle["version"]))


def targets_of(state: ServerState, target: str) -> list[Device]:
    """The registered devices ``device:ID`` or ``fleet:NAME`` names."""
    kind, name = target.split(":", 1)
    names = [d["device"] for d in state.store.devices() if (d["device"] if kind == "device" else d["fleet"]) == name]
    return [device for device in map(state.store.device, names) if device is not None]


def notify_assignment(state: ServerState, target: str, version: int) -> list[str]:
    """Tell the devices of ``target`` whose assignment is now ``version`` (a retained OTA command
    on their ota topic); the devices told."""
    state.changes += 1
    record = state.store.bundle(version)
    assert record is not None
    command = ota_command(record).model_dump_json().encode()
    notified = []
    for device in targets_of(state, target):
        if state.store.assignment(device) == version and state.bridge is not None:
            state.bridge.publish(device.fleet, device.device, "ota", command, retain=True)
            notified.append(device.device)
    return notified


def bundles_router(state: ServerState, auth: Auth) -> APIRouter:
    router = APIRouter(tags=["bundles"])

    @router.post(ROUTES["bundles"], status_code=201, response_model=BundleOut, max_body_size=MAX_BUNDLE_BYTES,
              openapi_extra=OCTET_STREAM)
    async def upload(request: Request, _: Annotated[Principal, Depends(auth.admin)]) -> BundleOut:
        """A signed bundle's tar as the body (application/octet-stream), at most MAX_BUNDLE_BYTES."""
        tmp, digest, _size = await receive_file(request, state.bundle_dir, ".tar")
        try:
            try:
                bundle = await run_in_threadpool(read_trusted, tmp, state.trusted_keys)
            except BundleError as err:
                log.warning("refused a bundle upload: %s", err)
                raise HTTPException(400, str(err).replace(str(tmp), "upload")) from None
            version, model = bundle.manifest.bundle_version, bundle.manifest.model
            target = state.bundle_dir / f"v{version}.tar"
            try:
                state.store.add_bundle(version, model, digest, target)
            except StoreError as err:
                raise HTTPException(409, str(err)) from None
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        log.info("stored bundle %s v%d", model, version)
        state.changes += 1
        return BundleOut(version=version, model=model, sha256=digest)

    @router.get(ROUTES["bundles"], response_model=list[BundleOut])
    def bundles(_: Annotated[Principal, Depends(auth.principal)]) -> list[dict[str, Any]]:
        return state.store.bundles()

    @router.get(ROUTES["bundle"], response_class=FileResponse)
    def download(version: int, _: Annotated[Principal, Depends(auth.principal)]) -> FileResponse:
        record = state.store.bundle(version) if 0 < version < 2**62 else None
        if record is None:
            raise HTTPException(404, f"bundle_version {version} is not uploaded")
        return FileResponse(record["path"], media_type="application/x-tar", filename=f"v{version}.tar")

    @router.post(ROUTES["assignments"], response_model=AssignmentOut)
    def assign(body: AssignmentIn, _: Annotated[Principal, Depends(auth.admin)]) -> AssignmentOut:
        kind, name = body.target.split(":", 1)
        if not targets_of(state, body.target):
            raise HTTPException(404, f"no registered {kind} {name!r}")
        try:
            state.store.assign(body.target, body.bundle_version)
        except StoreError as err:
            raise HTTPException(404, str(err)) from None
        notified = notify_assignment(state, body.target, body.bundle_version)
        return AssignmentOut(target=body.target, bundle_version=body.bundle_version, notified=notified)

    @router.get(ROUTES["assignments"])
    def assignments(_: Annotated[Principal, Depends(auth.admin)]) -> dict[str, int]:
        """Every assignment: target (device:ID or fleet:NAME) -> bundle version."""
        return state.store.assignments()

    return router
