"""API keys of the language model's OpenAI-style routes: made and revoked by the admin, kept as
their sha256 only (the key itself is shown once, when made), each with what it has used."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from server.store.database import Database, StoreError
from server.store.devices import token_sha256

KEY_PREFIX = "sk-trickle-"
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class LlmKeys(Database):
    """Making, finding, revoking API keys and counting their use."""

    def add_llm_key(self, name: str) -> str:
        """A new key named ``name``: the key (shown only now)."""
        if not KEY_NAME.match(name):
            raise StoreError(f"API key name {name[:80]!r}: use 1-64 letters, digits, '.', '_' or '-'")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        try:
            self._run("INSERT INTO llm_keys (name, key_sha256, created_s) VALUES (?, ?, ?)",
                      (name, token_sha256(key), time.time()))
        except self.integrity_errors:
            raise StoreError(f"API key {name!r} exists (revoked keys keep their name)") from None
        return key

    def llm_key_name(self, key: str) -> str | None:
        """The name of the live (not revoked) key ``key``, or None."""
        row = self._one("SELECT name FROM llm_keys WHERE key_sha256 = ? AND revoked_s IS NULL", (token_sha256(key),))
        return str(row[0]) if row else None

    def revoke_llm_key(self, name: str) -> bool:
        """Revoke ``name``; False when there is no live key of that name."""
        cursor = self._run("UPDATE llm_keys SET revoked_s = ? WHERE name = ? AND revoked_s IS NULL", (time.time(), name))
        return bool(cursor.rowcount)

    def record_llm_use(self, name: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._run("UPDATE llm_keys SET requests = requests + 1, prompt_tokens = prompt_tokens + ?, "
                  "completion_tokens = completion_tokens + ?, last_used_s = ? WHERE name = ?",
                  (prompt_tokens, completion_tokens, time.time(), name))

    def llm_keys(self) -> list[dict[str, Any]]:
        """Every key (never the key itself) with its use, oldest first."""
        rows = self._all("SELECT name, created_s, revoked_s, requests, prompt_tokens, completion_tokens, last_used_s "
                         "FROM llm_keys ORDER BY created_s, name")
        cols = ("name", "created_s", "revoked_s", "requests", "prompt_tokens", "completion_tokens", "last_used_s")
        return [dict(zip(cols, row)) for row in rows]
