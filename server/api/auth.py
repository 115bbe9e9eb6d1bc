"""Who is asking: the bearer token of a request as the admin or a registered device, and the
check that lets a request's body be read only once its token is known (``server.api.limits``)."""

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.api.state import Principal, ServerState


@dataclass(frozen=True)
class Auth:
    """The API's three dependencies: ``known(token)`` (any valid token), ``principal`` (who a
    request is: 401 without a valid token) and ``admin`` (403 unless the admin token); and
    ``is_admin(token)``."""

    known: Callable[[str], bool]
    principal: Callable[..., Principal]
    admin: Callable[..., Principal]
    is_admin: Callable[[str], bool]


def auth(state: ServerState) -> Auth:
    bearer = HTTPBearer(auto_error=False)

    def is_admin(token: str) -> bool:
        return hmac.compare_digest(token.encode(), state.admin_token.encode())

    def known(token: str) -> bool:
        return is_admin(token) or state.store.device_by_token(token) is not None

    def principal(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
        if credentials is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        token = credentials.credentials
        if is_admin(token):
            return Principal(True, None)
        device = state.store.device_by_token(token)
        if device is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return Principal(False, device)

    def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.admin:
            raise HTTPException(403, "needs the admin token")
        return who

    return Auth(known, principal, admin, is_admin)
