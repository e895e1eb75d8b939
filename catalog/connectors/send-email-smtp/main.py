"""send-email-smtp: the send-email/v1 connector on an SMTP submission server, an MCP server over stdio.

The router starts it (`python3 main.py`, in this folder) and calls `send_email_send`. Each call opens
one connection, requires STARTTLS (a server that does not offer it is refused: the password and the
message never travel in clear), logs in, and sends one plain-text message from the configured address.
Every recipient is checked before the message itself is sent: if the server refuses any of them, the
transaction is reset and nothing is sent (`rejected_recipient`). Temporary refusals that mean a rate or
quota (421, 450, 451, 452) are `limit`; a failed login, a lost connection or any other refusal is
`unavailable`. A connection lost while the server takes the message itself is `unavailable` too, but the
message may have gone out, so the model is told not to send it again (`handler/retry: never`): sending it
again could deliver it twice. The server's own wording goes to the log (stderr), never into a result.

Settings (environment): SMTP_HOST, SMTP_PORT (587), SMTP_USERNAME (the from address when unset),
SMTP_FROM, SMTP_CA_CERTIFICATES, SMTP_CA_FILE; secret: SMTP_PASSWORD. The server's certificate is checked
against the system's trust store, or against the CA certificates a private mail server needs: the PEM text of
SMTP_CA_CERTIFICATES (written in the binding), else SMTP_CA_FILE, a PEM file in this connector's folder (the
only place of the tree its sandbox shows).
"""

from __future__ import annotations

import contextlib
import logging
import os
import smtplib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

import anyio
from handler_kit import InterfaceError, Reply, needs_a_person, serve

log = logging.getLogger("send-email-smtp")

TIMEOUT = 20.0  # seconds for each exchange with the server; send-email/v1 allows a call 60
LIMIT_CODES = frozenset({421, 450, 451, 452})
MAX_ADDRESS = 254


@dataclass(frozen=True, slots=True)
class Config:
    host: str
    port: int
    username: str
    password: str
    sender: str
    ca_file: str | None = None  # trust these CA certificates instead of the system's
    ca_pem: str | None = None  # or these, given as PEM text

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        """The settings; a missing or malformed one is `unavailable` (the binding needs fixing)."""
        host, sender = env.get("SMTP_HOST", "").strip(), env.get("SMTP_FROM", "").strip()
        if not host or not sender:
            raise needs_a_person("the email service is not configured (no server or no sender address); an "
                                 "administrator must fix its binding")
        port_text = env.get("SMTP_PORT", "").strip() or "587"
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise needs_a_person("the email service's port setting is not a port number; an administrator must fix "
                                 "its binding")
        return cls(host, int(port_text), env.get("SMTP_USERNAME", "").strip() or sender,
                   env.get("SMTP_PASSWORD", ""), sender, _ca_file(env.get("SMTP_CA_FILE", "").strip()),
                   _ca_pem(env.get("SMTP_CA_CERTIFICATES", "").strip()))

    def tls_context(self) -> ssl.SSLContext:
        """What the server's certificate is checked against: the CA certificates given, else the system's."""
        if self.ca_pem:
            return ssl.create_default_context(cadata=self.ca_pem)
        return ssl.create_default_context(cafile=self.ca_file)


def _ca_file(name: str) -> str | None:
    """SMTP_CA_FILE as a path: relative to this connector's folder; one that is not there is `unavailable`."""
    if not name:
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    if not os.path.isfile(path):
        raise needs_a_person("the email service's CA file setting names no file in the connector's folder; an "
                             "administrator must fix its binding")
    return path


def _ca_pem(text: str) -> str | None:
    """SMTP_CA_CERTIFICATES as PEM text; text holding no certificate is `unavailable` (the binding needs fixing)."""
    if not text:
        return None
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError):
        raise needs_a_person("the email service's ca_certificates setting holds no PEM certificate; an "
                             "administrator must fix its binding") from None
    return text


def addresses(args: dict[str, Any], key: str) -> list[str]:
    """A list of addresses from the call, each one line and bounded (the router checked the schema)."""
    value = args.get(key) or []
    if not isinstance(value, list):
        raise InterfaceError("rejected_recipient", f"'{key}' is not a list of addresses; nothing was sent")
    out: list[str] = []
    for item in value:
        if (not isinstance(item, str) or len(item) > MAX_ADDRESS or "@" not in item
                or any(c in item for c in "\r\n<>,")):
            raise InterfaceError("rejected_recipient", f"{str(item)[:80]!r} is not an email address; nothing was sent")
        out.append(item.strip())
    return out


def build_message(sender: str, args: dict[str, Any]) -> tuple[EmailMessage, list[str]]:
    """The message and its envelope recipients (to then cc, each once)."""
    to, cc = addresses(args, "to"), addresses(args, "cc")
    if not to:
        raise InterfaceError("rejected_recipient", "no recipient was given; nothing was sent")
    subject = " ".join(str(args.get("subject", "")).splitlines())
    body = str(args.get("body", ""))
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    if cc:
        msg["Cc"] = ", ".join(cc)
    msg["Subject"] = subject
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    domain = sender.rsplit("@", 1)[-1] or None
    msg["Message-ID"] = make_msgid(domain=domain)
    # Quoted-printable keeps non-ASCII text readable by servers without 8BITMIME.
    msg.set_content(body, cte="7bit" if body.isascii() else "quoted-printable")
    return msg, list(dict.fromkeys(to + cc))


def vendor_said(what: str, code: int, reply: bytes | str) -> None:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    log.warning("server refused %s: %d %s", what, code, text[:300])


def refused(what: str, code: int, reply: bytes) -> InterfaceError:
    """The interface error for a refusal of the sender or of the message (not of a recipient)."""
    vendor_said(what, code, reply)
    if code in LIMIT_CODES:
        return InterfaceError("limit", f"the mail server refused {what} for now (a sending rate or quota was "
                              "reached); nothing was sent, retry later")
    if code >= 500:  # a permanent refusal (RFC 5321): the same email is refused again
        return InterfaceError("unavailable", f"the mail server refused {what} (code {code}); nothing was sent, and "
                              "sending the same email again would be refused too: tell the user", retry="never")
    return InterfaceError("unavailable", f"the mail server refused {what} for now (code {code}); nothing was sent; "
                          "retrying later may work")


def require_starttls(smtp: smtplib.SMTP) -> None:
    if not smtp.has_extn("starttls"):
        raise needs_a_person("the mail server does not offer STARTTLS (encryption), so this connector refuses to "
                             "send through it and nothing was sent; an administrator must point the binding at a "
                             "server that does")


def open_session(config: Config) -> smtplib.SMTP:
    """A logged-in connection over STARTTLS; never logs in or sends anything in clear."""
    smtp = smtplib.SMTP(config.host, config.port, timeout=TIMEOUT)
    try:
        smtp.ehlo()
        require_starttls(smtp)
        smtp.starttls(context=config.tls_context())
        smtp.ehlo()
        if config.password or smtp.has_extn("auth"):
            smtp.login(config.username, config.password)
    except BaseException:
        smtp.close()
        raise
    return smtp


def transact(smtp: smtplib.SMTP, sender: str, msg: EmailMessage, recipients: list[str]) -> list[str]:
    """MAIL, RCPT for every recipient, then DATA only if all were accepted."""
    code, reply = smtp.mail(sender)
    if code != 250:
        raise refused("the sender address", code, reply)
    for address in recipients:
        try:
            code, reply = smtp.rcpt(address)
        except UnicodeEncodeError:
            code, reply = 553, b"non-ASCII address"
        if code in (250, 251):
            continue
        with contextlib.suppress(smtplib.SMTPException, OSError):
            smtp.rset()
        if code in LIMIT_CODES:
            raise refused("more recipients", code, reply)
        vendor_said(f"recipient {address}", code, reply)
        if 500 <= code < 600:
            raise InterfaceError("rejected_recipient", f"the mail server refused the address {address}; "
                                 "nothing was sent")
        raise InterfaceError("unavailable", f"the mail server could not take the address {address} for now "
                             f"(code {code}); nothing was sent")
    content = msg.as_bytes(policy=msg.policy.clone(linesep="\r\n"))
    try:
        code, reply = smtp.data(content)
    except smtplib.SMTPResponseException as exc:  # the DATA command itself refused: none of the message was sent
        raise refused("the message", exc.smtp_code, exc.smtp_error) from None
    except OSError as exc:  # a lost connection (`SMTPServerDisconnected`) or a socket error, smtplib's or the host's
        # The message may have been taken before the connection was lost: sending it again could deliver it twice.
        log.warning("connection lost during DATA: %r", exc)
        raise InterfaceError("unavailable", "the connection to the mail server was lost while it took the message, "
                             "so the email may have been sent: do not send it again; tell the user to check whether "
                             "it arrived", retry="never") from None
    if code != 250:
        raise refused("the message", code, reply)
    return recipients


def send(config: Config, args: dict[str, Any]) -> dict[str, Any]:
    """Send one email; its Message-ID and accepted recipients, or an InterfaceError."""
    msg, recipients = build_message(config.sender, args)
    where = f"{config.host}:{config.port}"
    try:
        smtp = open_session(config)
        try:
            accepted = transact(smtp, config.sender, msg, recipients)
        finally:
            with contextlib.suppress(smtplib.SMTPException, OSError):
                smtp.quit()
            smtp.close()
    except InterfaceError:
        raise
    except smtplib.SMTPAuthenticationError as exc:
        vendor_said("the login", exc.smtp_code, exc.smtp_error)
        raise needs_a_person("the mail server refused the login and nothing was sent; an administrator must check "
                             "the account and its password") from None
    except smtplib.SMTPNotSupportedError:
        raise needs_a_person("the mail server does not accept a login on this port and nothing was sent; an "
                             "administrator must fix the binding's port") from None
    except ssl.SSLCertVerificationError:
        raise needs_a_person(f"the certificate of the mail server at {where} could not be verified and nothing "
                             "was sent; an administrator must fix the binding's server or its CA setting") from None
    except smtplib.SMTPResponseException as exc:
        raise refused("the connection", exc.smtp_code, exc.smtp_error) from None
    except (smtplib.SMTPException, OSError) as exc:
        log.warning("connection to %s failed: %r", where, exc)
        raise InterfaceError("unavailable", f"the mail server at {where} could not be reached or closed the "
                             "connection; retrying later may work") from None
    return {"messageId": str(msg["Message-ID"]), "acceptedRecipients": accepted}


async def send_email_send(args: dict[str, Any]) -> Reply:
    config = Config.from_env(os.environ)
    output = await anyio.to_thread.run_sync(send, config, args)
    return Reply(output, f"Sent {output['messageId']} to {', '.join(output['acceptedRecipients'])}")


def main() -> None:
    serve("send-email/v1", "send-email-smtp", {"send_email_send": send_email_send},
          failed="the email could not be sent because of an unexpected failure; retrying later may work")


if __name__ == "__main__":
    main()
