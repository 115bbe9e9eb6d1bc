"""Devices: registration (admin), the registry, a device's token rotated or revoked (admin), and
each device's stored messages (a device reads only its own)."""

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field

from edge.contract.protocol import DEVICE_KINDS, ROUTES, Name
from server.api.auth import Auth
from server.api.state import Principal, ServerState
from server.store.store import StoreError

log = logging.getLogger("trickle.server.http")


class DeviceIn(BaseModel):
    """A device to register, and its fleet."""

    device: Name
    fleet: Name = "default"


class DeviceOut(BaseModel):
    """A registered device and its token (shown once)."""

    device: str
    fleet: str
    token: str = Field(description="bearer token for HTTP, MQTT password, and the key of the device's HMAC signatures")


def devices_router(state: ServerState, auth: Auth) -> APIRouter:
    router = APIRouter(tags=["devices"])

    @router.post(ROUTES["devices"], status_code=201, response_model=DeviceOut)
    def register(body: DeviceIn, _: Annotated[Principal, Depends(auth.admin)]) -> DeviceOut:
        try:
            d = state.store.add_device(body.device, body.fleet)
        except StoreError as err:
            raise HTTPException(409, str(err)) from None
        log.info("registered device %s in fleet %s", d.device, d.fleet)
        state.changes += 1
        return DeviceOut(device=d.device, fleet=d.fleet, token=d.token)

    def token_replaced(device: str, how: str) -> None:
        """What follows a token's replacement: the embedded broker closes the device's connections,
        the dashboard's stream pushes."""
        for close in state.on_token_revoked:
            close(device)
        log.info("%s the token of device %s", how, device)
        state.changes += 1

    @router.post(ROUTES["device_token"], response_model=DeviceOut)
    def rotate_token(device: Name, _: Annotated[Principal, Depends(auth.admin)]) -> DeviceOut:
        """A new token for the device (shown once); its old one is revoked at once: refused over HTTP
        and by the embedded broker, which also closes the device's connections, and refused as the
        key of its messages' signatures by every replica's bridge within 2 s (each caches tokens
        that long). Behind Mosquitto, write its files again (``trickle serve --write-mosquitto-config``)
        and SIGHUP it, as for a registration: it then refuses the old password and drops the
        device's connection."""
        record = state.store.rotate_token(device)
        if record is None:
            raise HTTPException(404, f"device {device!r} is not registered")
        token_replaced(device, "rotated")
        return DeviceOut(device=record.device, fleet=record.fleet, token=record.token)

    @router.delete(ROUTES["device_token"], status_code=204)
    def revoke_token(device: Name, _: Annotated[Principal, Depends(auth.admin)]) -> None:
        """Revoke the device's token without a new one (as ``POST`` revokes it, everywhere): the device
        can do nothing until the admin rotates it again (``POST``)."""
        if state.store.revoke_token(device) is None:
            raise HTTPException(404, f"device {device!r} is not registered")
        token_replaced(device, "revoked")

    @router.get(ROUTES["devices"])
    def devices(_: Annotated[Principal, Depends(auth.admin)]) -> list[dict[str, Any]]:
        return state.store.devices()

    @router.get(ROUTES["messages"])
    def messages(device: Name, kind: str, who: Annotated[Principal, Depends(auth.principal)],
                 since_s: Annotated[float | None, Query(ge=0, le=1e11)] = None,
                 until_s: Annotated[float | None, Query(ge=0, le=1e11)] = None,
                 limit: Annotated[int, Query(ge=1, le=100_000)] = 1000) -> list[dict[str, Any]]:
        if kind not in DEVICE_KINDS:
            raise HTTPException(404, f"kind {kind!r}: must be one of {', '.join(DEVICE_KINDS)}")
        if not who.admin and (who.device is None or who.device.device != device):
            raise HTTPException(403, "a device reads only its own messages")
        return state.store.messages(device, kind, since_s, until_s, limit)

    return router
