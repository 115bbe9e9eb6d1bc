"""Devices: registration (admin), the registry, and each device's stored messages (a device reads
only its own)."""

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
