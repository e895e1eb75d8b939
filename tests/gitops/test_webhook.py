"""The push webhook's signature: GitHub's HMAC-SHA256 of the body, compared in constant time."""

from __future__ import annotations

from reconciler.gitops.webhook import sign_body, verify_signature

SECRET = b"It's a Secret to Everybody"


def test_signature_matches_githubs_documented_example() -> None:
    # The example of GitHub's "Validating webhook deliveries" page.
    assert sign_body(SECRET, b"Hello, World!") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )
    assert verify_signature(SECRET, b"Hello, World!", sign_body(SECRET, b"Hello, World!"))
    assert not verify_signature(SECRET, b"Hello, World?", sign_body(SECRET, b"Hello, World!"))
    assert not verify_signature(SECRET, b"x", None)
    assert not verify_signature(b"", b"x", sign_body(b"", b"x"))
