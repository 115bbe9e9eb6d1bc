"""The device's half of client–server speculative decoding reaches the target here: one round of
verification per request (``server.llm.verify``)."""

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException

from edge.contract.protocol import ROUTES, VerifyRequest, VerifyResponse
from server.api.auth import Auth
from server.api.state import Principal, ServerState


def verify_router(state: ServerState, auth: Auth) -> APIRouter:
    router = APIRouter(tags=["llm"])

    @router.post(ROUTES["verify"], response_model=VerifyResponse)
    def verify(body: VerifyRequest, who: Annotated[Principal, Depends(auth.principal)]) -> VerifyResponse:
        """One round of client–server speculative decoding (``server.llm.verify``): 409 when the
        session must be resent from its start, 400 when the target cannot take the request, 404
        when the server has no language model."""
        from server.llm.verify import answer

        sessions = state.llm.sessions() if state.llm is not None else None
        status, detail, response = answer(sessions, "admin" if who.device is None else who.device.device, body)
        if response is None:
            raise HTTPException(status, detail)
        return response

    return router
