"""The shipped send-email-smtp connector against a real SMTP server on loopback (aiosmtpd).

Sending over STARTTLS needs the connector to trust the test's self-signed certificate. Its own `send` (loaded
from its main.py) is tested with SSL_CERT_FILE pointing at that certificate; through the real router and its
sandbox, which pass no SSL_CERT_FILE, the binding's `ca_file` setting names the certificate, put in the
connector's folder: `handler connector check` runs send-email/v1's cases and fuzzing that way. A server
without STARTTLS is refused as `unavailable`, through the router as well.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
from collections.abc import Iterator
from email import message_from_bytes, policy
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.fixtures.harness import RawClient, body, serving, short_dir
from tests.fixtures.mail import free_port, self_signed, starttls_server
from tests.fixtures.vendor_trees import passing_check

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = REPO / "catalog/connectors/send-email-smtp"
SENDER = "agents@example.org"
CREDENTIAL = "app-password"


def load_connector() -> ModuleType:
    spec = importlib.util.spec_from_file_location("send_email_smtp_main", CONNECTOR / "main.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


main = load_connector()


class Mailbox:
    """An aiosmtpd handler: refuses some recipients as a real server would, keeps what it received."""

    def __init__(self) -> None:
        self.received: list[tuple[str, list[str], bytes]] = []
        self.rcpt_seen: list[str] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        self.rcpt_seen.append(address)
        if address.endswith("@domain.invalid"):
            return "550 5.1.1 <" + address + ">: Recipient address rejected: User unknown"
        if address.startswith("quota@"):
            return "452 4.5.3 Too many recipients today, try later"
        if address.startswith("unready@"):  # accepted, yet not kept: the server then refuses the DATA command itself
            return "250 OK"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if any(address.startswith("spam@") for address in envelope.rcpt_tos):
            return "554 5.7.1 Message rejected as spam"
        if any(address.startswith("greylisted@") for address in envelope.rcpt_tos):
            return "454 4.7.0 Temporary authentication failure, try again later"
        self.received.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content))
        if any(address.startswith("dropped@") for address in envelope.rcpt_tos):
            server.transport.close()  # taken, and the connection lost before the client reads that it was
        return "250 Message accepted"


def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
    ok = isinstance(data, LoginPassword) and data.login == SENDER.encode() and data.password == CREDENTIAL.encode()
    return AuthResult(success=ok, handled=False)  # not handled: the server answers 535 itself


@pytest.fixture(scope="module")
def certificate() -> Iterator[tuple[Path, Path]]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    with short_dir() as folder:
        yield self_signed(folder, "127.0.0.1")


@pytest.fixture
def tls_server(certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Mailbox, int]]:
    """A submission server that requires STARTTLS and a login; the connector trusts its certificate."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    mailbox, port = Mailbox(), free_port()
    with starttls_server(mailbox, "127.0.0.1", port, certificate, authenticate):
        yield mailbox, port


def config(port: int, password: str = CREDENTIAL) -> Any:
    return main.Config(host="127.0.0.1", port=port, username=SENDER, password=password, sender=SENDER)


def refusal(port: int, args: dict[str, Any], password: str = CREDENTIAL) -> tuple[str, str]:
    error = raised(port, args, password)
    return error.code, error.message


def raised(port: int, args: dict[str, Any], password: str = CREDENTIAL) -> Any:
    """The interface error a send raises: its code, message and `retry`."""
    with pytest.raises(main.InterfaceError) as caught:
        main.send(config(port, password), args)
    return caught.value


def test_it_sends_over_starttls_with_subject_body_sender_and_recipients(tls_server: tuple[Mailbox, int]) -> None:
    mailbox, port = tls_server
    out = main.send(config(port), {"to": ["alice@example.org"], "cc": ["bob@example.org"],
                                   "subject": "Invoice INV-42 — reçu", "body": "Hello Alice,\nThe total is 50 €.\n"})
    assert out["acceptedRecipients"] == ["alice@example.org", "bob@example.org"]
    assert out["messageId"].startswith("<")
    assert out["messageId"].endswith("@example.org>")
    [(mail_from, rcpt_tos, raw)] = mailbox.received
    assert (mail_from, rcpt_tos) == (SENDER, ["alice@example.org", "bob@example.org"])
    received = message_from_bytes(raw, policy=policy.default)
    assert received["From"] == SENDER
    assert received["To"] == "alice@example.org"
    assert received["Cc"] == "bob@example.org"
    assert received["Subject"] == "Invoice INV-42 — reçu"
    assert received["Message-ID"] == out["messageId"]
    assert received.get_content().replace("\r\n", "\n") == "Hello Alice,\nThe total is 50 €.\n"


def test_a_refused_recipient_sends_nothing(tls_server: tuple[Mailbox, int]) -> None:
    mailbox, port = tls_server
    code, message = refusal(port, {"to": ["alice@example.org", "nobody@domain.invalid"], "subject": "Hi",
                                   "body": "Hello.\n"})
    assert code == "rejected_recipient"
    assert "nobody@domain.invalid" in message
    assert "nothing was sent" in message
    assert "User unknown" not in message  # the server's own wording stays in the log
    assert mailbox.rcpt_seen == ["alice@example.org", "nobody@domain.invalid"]
    assert mailbox.received == []


def test_a_quota_refusal_is_limit(tls_server: tuple[Mailbox, int]) -> None:
    mailbox, port = tls_server
    code, message = refusal(port, {"to": ["quota@example.org"], "subject": "Hi", "body": "Hello.\n"})
    assert code == "limit"
    assert "Too many" not in message
    assert mailbox.received == []


def test_a_message_refused_for_good_is_not_retried_and_one_refused_for_now_is(
        tls_server: tuple[Mailbox, int]) -> None:
    """A 5xx refusal of the message stands (RFC 5321): sending the same email again is refused too. A 4xx one is for
    now: retrying later may work."""
    mailbox, port = tls_server
    spam = raised(port, {"to": ["spam@example.org"], "subject": "Hi", "body": "Hello.\n"})
    assert (spam.code, spam.retry) == ("unavailable", "never")
    assert "refused the message (code 554); nothing was sent" in spam.message
    assert "tell the user" in spam.message
    assert "Message rejected" not in spam.message  # the server's own wording stays in the log
    later = raised(port, {"to": ["greylisted@example.org"], "subject": "Hi", "body": "Hello.\n"})
    assert (later.code, later.retry) == ("unavailable", None)
    assert later.message.endswith("(code 454); nothing was sent; retrying later may work")
    assert mailbox.received == []


def test_a_connection_lost_while_the_server_takes_the_message_says_not_to_send_it_again(
        tls_server: tuple[Mailbox, int]) -> None:
    """The server took the message and the connection dropped before its answer: the email went out, so calling again
    would deliver it twice. The model is told it may have been sent and not to send it again."""
    mailbox, port = tls_server
    lost = raised(port, {"to": ["dropped@example.org"], "subject": "Invoice", "body": "Hello.\n"})
    assert (lost.code, lost.retry) == ("unavailable", "never")
    assert "may have been sent: do not send it again" in lost.message
    assert "retrying later may work" not in lost.message
    assert [rcpt for _, rcpt, _ in mailbox.received] == [["dropped@example.org"]]  # it did go out


def test_a_server_that_refuses_the_data_command_itself_says_nothing_was_sent(tls_server: tuple[Mailbox, int]) -> None:
    """A refusal of DATA comes before any of the message is sent: the model is told nothing was sent, never that the
    email may have gone out."""
    mailbox, port = tls_server
    refused = raised(port, {"to": ["unready@example.org"], "subject": "Invoice", "body": "Hello.\n"})
    assert refused.code == "unavailable"
    assert "nothing was sent" in refused.message
    assert "may have been sent" not in refused.message
    assert mailbox.received == []


def test_a_refused_login_or_a_closed_port_is_unavailable(tls_server: tuple[Mailbox, int]) -> None:
    mailbox, port = tls_server
    login = raised(port, {"to": ["alice@example.org"], "subject": "Hi", "body": "Hello.\n"}, "wrong")
    assert (login.code, "login" in login.message, login.retry) == ("unavailable", True, "never")  # until it is fixed
    code, message = refusal(free_port(), {"to": ["alice@example.org"], "subject": "Hi", "body": "Hello.\n"})
    assert (code, "could not be reached" in message) == ("unavailable", True)
    assert mailbox.received == []


def test_an_untrusted_certificate_is_unavailable(tls_server: tuple[Mailbox, int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    mailbox, port = tls_server
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv("SSL_CERT_DIR", "/nonexistent")
    code, message = refusal(port, {"to": ["alice@example.org"], "subject": "Hi", "body": "Hello.\n"})
    assert (code, "certificate" in message) == ("unavailable", True)
    assert mailbox.received == []


BINDING = """apiVersion = "handler.binding/v1"
name = "email-test"
connector = "send-email-smtp"
secrets = {{ password = {{ env = "TEST_SMTP_CREDENTIAL" }} }}
settings = {{ host = "{host}", port = "587", from = "agents@example.org" }}
egress = ["{host}:587"]  # its exact address: the sandbox forwards that port, the proxy allows that address

[pricing]
send_email_send = 0.0
"""

PROFILE = """apiVersion = "handler.profile/v1"
name = "tester"
scope = "work/tester"
template = "permissive"
services = { send-email = "email-test" }

[[rules]]
action = "send_email_send"
outcome = "allow"
"""


def test_through_the_router_a_server_without_starttls_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SMTP_CREDENTIAL", CREDENTIAL)
    # Port 587 on a loopback address of its own (the tests run as root, as CI does), so the binding's egress can
    # narrow the connector's `*:587` to that one address.
    mailbox, host = Mailbox(), "127.0.58.7"
    controller = Controller(mailbox, hostname=host, port=587)  # plain SMTP, no STARTTLS offered
    controller.start()
    try:
        with short_dir() as folder:
            root, run_dir = folder / "t", folder / "r"
            for part in ("catalog/interfaces", "catalog/connectors", "config"):
                shutil.copytree(REPO / part, root / part)
            (root / "config/bindings/email-test.toml").write_text(BINDING.format(host=host))
            (root / "config/profiles/tester.toml").write_text(PROFILE)

            async def scenario() -> dict[str, Any]:
                async with serving(root, run_dir) as router:  # sandboxed: SMTP through the relay's raw forward
                    client = await RawClient.connect(router.socket_path("tester"))
                    try:
                        return await client.call("send_email_send", {"to": ["alice@example.org"],
                                                                     "subject": "Hi", "body": "Hello.\n"})
                    finally:
                        await client.close()

            result = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        controller.stop()
    assert result["isError"] is True, result
    assert body(result)["error"] == "unavailable"
    assert "STARTTLS" in body(result)["message"]
    assert mailbox.received == []
    assert mailbox.rcpt_seen == []


CHECK_HOST = "127.0.58.9"  # port 587 on a loopback address of its own (as root, as CI runs), for the check

CHECK_BINDING = f"""apiVersion = "handler.binding/v1"
name = "email-check"
connector = "send-email-smtp"
secrets = {{ password = {{ env = "TEST_SMTP_CREDENTIAL" }} }}
settings = {{ host = "{CHECK_HOST}", from = "{SENDER}", ca_file = "test-ca.pem" }}
egress = ["{CHECK_HOST}:587"]
"""


@pytest.fixture
def check_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Mailbox, Path]]:
    """A submission server on CHECK_HOST:587 requiring STARTTLS and a login, and a tree whose binding trusts its
    certificate through the connector's `ca_file` setting (a file in the connector's folder)."""
    monkeypatch.setenv("TEST_SMTP_CREDENTIAL", CREDENTIAL)
    with short_dir() as folder:
        certificate = self_signed(folder, CHECK_HOST)
        root = folder / "t"
        for part in ("catalog/interfaces", "catalog/connectors", "config"):
            shutil.copytree(REPO / part, root / part)
        shutil.copy(certificate[0], root / "catalog/connectors/send-email-smtp/test-ca.pem")
        (root / "config/bindings/email-check.toml").write_text(CHECK_BINDING)
        mailbox = Mailbox()
        with starttls_server(mailbox, CHECK_HOST, 587, certificate, authenticate):
            yield mailbox, root


def test_connector_check_passes_against_the_stand_in(check_server: tuple[Mailbox, Path], tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """Through the real router and its sandbox, against a STARTTLS server standing in for the provider's (the catalog
    workflow runs it when the connector changes): the cases and fuzzing of send-email/v1, each message received
    with its subject, body and recipients, the impossible recipient refused before anything is sent."""

    mailbox, root = check_server
    summary = passing_check("send-email-smtp", "email-check", root, "send-email/v1", examples=5, seed=4,
                            result=tmp_path / "result.json", capfd=capfd)
    assert summary["fuzzing_pass"]
    sent = {msg["Subject"]: (rcpt, msg) for _, rcpt, raw in mailbox.received
            for msg in [message_from_bytes(raw, policy=policy.default)]}
    rcpt, first = sent["Conformance check"]
    assert rcpt == ["conformance@example.org"]
    assert first["From"] == SENDER
    assert first.get_content().replace("\r\n", "\n") == "This message checks that the service can send email.\n"
    assert sent["Conformance check with copy"][0] == ["conformance@example.org", "conformance-cc@example.org"]
    assert "nobody@domain.invalid" in mailbox.rcpt_seen  # asked, refused, and nothing was sent to it
    assert all("nobody@domain.invalid" not in rcpt for rcpt, _ in sent.values())
