"""A secret in an edit is a reference by name, never a value; the dashboard takes `env` and `file` alone."""

from __future__ import annotations

import pytest

from reconciler.config.editing import FORM_SECRET_KINDS, EditError, parse_secret, secret_reference, use_bindings
from reconciler.config.sources import Blob, blob_sha


def test_a_reference_names_where_the_secret_is() -> None:
    assert secret_reference("api_key", "env", "BRAVE_API_KEY") == {"env": "BRAVE_API_KEY"}
    assert secret_reference("api_key", "file", " /run/secrets/brave ", FORM_SECRET_KINDS) == (
        {"file": "/run/secrets/brave"})
    assert secret_reference("api_key", "command", "pass show 'brave/api key'") == (
        {"command": ["pass", "show", "brave/api key"]})
    assert parse_secret("api_key=env:BRAVE_API_KEY") == ("api_key", {"env": "BRAVE_API_KEY"})


def test_a_form_takes_no_command_and_nothing_that_looks_like_a_value() -> None:
    with pytest.raises(EditError, match="a command reference runs in the router, so it is not taken here; give an "
                                        "env or file reference"):
        secret_reference("api_key", "command", "cat /run/key", FORM_SECRET_KINDS)
    with pytest.raises(EditError, match="'value' is not a kind of reference; give env or file"):
        secret_reference("api_key", "value", "sk-123", FORM_SECRET_KINDS)
    with pytest.raises(EditError, match="never by value") as refused:
        secret_reference("api_key", "env", "sk-live-51Hq")
    assert "sk-live-51Hq" not in str(refused.value)  # what may be the secret itself is not repeated
    with pytest.raises(EditError, match="name the variable it is read from"):
        secret_reference("api_key", "env", "  ")
    with pytest.raises(EditError, match="is not a path"):
        secret_reference("api_key", "file", "a\nb")
    with pytest.raises(EditError, match="never by value"):
        secret_reference("api_key", "env", "A B")
    with pytest.raises(EditError, match="a slot's name"):
        secret_reference("api key", "env", "K")


def test_a_command_without_a_program_is_refused() -> None:
    """What the shell splits to an empty first word could never run: refused as the binding file would be."""
    for command in ('""', "'' show key"):
        with pytest.raises(EditError, match="the command names no program"):
            secret_reference("api_key", "command", command)


def _profile(text: str) -> dict[str, Blob]:
    data = text.encode()
    return {"config/profiles/p.toml": Blob("config/profiles/p.toml", blob_sha(data), data)}


def _use(text: str, *uses: tuple[str, str]) -> str:
    return use_bindings(_profile(text), "p", uses).files["config/profiles/p.toml"]


_TABLE = '''apiVersion = "handler.profile/v1"
scope = "work/p"

[services]
# On this machine.
"ocr/v1" = "ocr-local"  # pinned: v2 reads worse
web-search = "search-brave"  # the team's key

[caps]
monthly_usd = 5.0
'''

_DOTTED = '''apiVersion = "handler.profile/v1"
scope = "work/p"
services."ocr/v1" = "ocr-local"  # pinned: v2 reads worse
services.web-search = "search-brave"  # the team's key
pins = ["web-search"]
'''


@pytest.mark.parametrize("text", [_TABLE, _DOTTED], ids=["services-table", "dotted-keys"])
def test_profile_use_keeps_each_key_where_it_stands_with_its_comment(text: str) -> None:
    prefix = "services." if text is _DOTTED else ""
    # Another binding: the value alone changes.
    assert _use(text, ("web-search", "search-searxng")) == text.replace(
        'web-search = "search-brave"', 'web-search = "search-searxng"')
    # Another version: the pinned key is replaced where it stood, its comment kept.
    assert _use(text, ("ocr/v2", "ocr-mistral")) == text.replace(
        '"ocr/v1" = "ocr-local"', '"ocr/v2" = "ocr-mistral"')
    # A new interface comes after the last key of services.
    assert _use(text, ("llm", "llm-anthropic")) == text.replace(
        "# the team's key\n", f"# the team's key\n{prefix}llm = \"llm-anthropic\"\n")


def test_profile_use_refuses_services_that_are_not_a_table() -> None:
    with pytest.raises(EditError, match=r"config/profiles/p\.toml: services is not a table"):
        _use('apiVersion = "handler.profile/v1"\nscope = "w"\nservices = "ocr-local"\n', ("ocr", "ocr-local"))
