"""GitHub's push webhook: the `X-Hub-Signature-256` check.

GitHub signs the raw body with HMAC-SHA256 and the webhook's secret and sends
`sha256=<hex digest>`; a request whose signature does not match is refused.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["sign_body", "verify_signature"]


def sign_body(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """True when `header` is GitHub's signature of `body` with `secret` (compared in constant time)."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    return hmac.compare_digest(sign_body(secret, body).encode(), header.encode())  # bytes: a str with "é" raises
