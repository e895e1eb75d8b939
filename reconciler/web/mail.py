"""The email channel: an SMTP client that tells a member a hold waits for them, with a signed link.

Configured by `HANDLER_SMTP_URL` (`smtp://[user:password@]host[:port]`, `smtps://` for implicit
TLS, `?starttls=true` to upgrade a plain connection) and `HANDLER_MAIL_FROM`. The message names
who asks for what and at which estimated cost, never the call's arguments: those are shown on the
page the link opens.
"""

from __future__ import annotations

import smtplib
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from urllib.parse import parse_qs, unquote, urlsplit

from reconciler.config.errors import HandlerError
from reconciler.governance.alerts import Alert
from reconciler.governance.holds import Hold
from reconciler.governance.rulebook import from_micros

__all__ = ["MailError", "MailSettings", "alert_message", "approval_message", "send_mail"]


class MailError(HandlerError):
    """The mail could not be sent (the message says why; permanent tells whether a retry can help)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True, slots=True)
class MailSettings:
    host: str
    port: int
    implicit_tls: bool
    starttls: bool
    user: str | None
    password: str | None
    sender: str
    timeout: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MailSettings | None:
        """The settings, or None when `HANDLER_SMTP_URL` is not set (the channel is off)."""
        url = env.get("HANDLER_SMTP_URL", "").strip()
        if not url:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise MailError(f"HANDLER_SMTP_URL must look like smtp://[user:password@]host[:port] or smtps://...; "
                            f"got scheme '{parts.scheme}'")
        query = parse_qs(parts.query)
        implicit = parts.scheme == "smtps"
        sender = env.get("HANDLER_MAIL_FROM", "").strip() or f"handler@{socket.getfqdn()}"
        return cls(parts.hostname, parts.port or (465 if implicit else 25), implicit,
                   query.get("starttls", ["false"])[0].lower() in ("1", "true", "yes"),
                   unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None, sender)


def _message(sender: str, to: str, subject: str, body: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    message.set_content(body)
    return message


def approval_message(hold: Hold, link: str, sender: str, to: str) -> EmailMessage:
    return _message(
        sender, to, f"Approval needed: {hold.profile} wants to run {hold.tool} ({hold.id})",
        f"Agent profile {hold.profile} (instance {hold.instance}) asks to run {hold.interface} {hold.tool}.\n"
        f"Estimated cost: ${from_micros(hold.cost):.4f}\n"
        f"Why it waits for you: {hold.reason}\n\n"
        f"See the request and decide:\n{link}\n\n"
        "Opening the link decides nothing: the page asks you to confirm.\n"
        f"Or from a shell: handler approvals approve {hold.id} --as <you>\n")


def alert_message(alert: Alert, sender: str, to: str, dashboard: str) -> EmailMessage:
    """An owner told, once, that a binding cannot start until someone sets it up, and what is missing."""
    return _message(
        sender, to, f"Not set up: binding {alert.binding} cannot start, and its calls fail",
        f"Calls served by binding {alert.binding} fail: it cannot start on this machine until someone sets it up.\n"
        f"What is missing: {alert.message}\n\n"
        "Agents are told the service is not set up and that retrying will not help; nothing is retried.\n"
        "Once it is set up, the next call starts it. This is the only message about this cause; the dashboard "
        f"({dashboard.rstrip('/')}/) and `handler status` list it with the calls that failed on it.\n")


def send_mail(settings: MailSettings, message: EmailMessage) -> None:
    """Deliver `message` (blocking: run it in a thread). Raises `MailError`."""
    context = ssl.create_default_context()
    try:
        client: smtplib.SMTP
        if settings.implicit_tls:
            client = smtplib.SMTP_SSL(settings.host, settings.port, timeout=settings.timeout, context=context)
        else:
            client = smtplib.SMTP(settings.host, settings.port, timeout=settings.timeout)
        with client:
            if settings.starttls:
                client.starttls(context=context)
            if settings.user:
                client.login(settings.user, settings.password or "")
            client.send_message(message)
    except smtplib.SMTPRecipientsRefused as exc:
        raise MailError(f"the mail server refused the recipient: {_first_reply(exc.recipients)}",
                        permanent=True) from None
    except smtplib.SMTPAuthenticationError as exc:
        raise MailError(f"the mail server refused the login ({exc.smtp_code}); check HANDLER_SMTP_URL") from None
    except smtplib.SMTPResponseException as exc:
        raise MailError(f"the mail server answered {exc.smtp_code}: {_text(exc.smtp_error)}") from None
    except (smtplib.SMTPException, OSError) as exc:
        raise MailError(f"cannot reach the mail server {settings.host}:{settings.port}: {exc}") from None


def _first_reply(recipients: Mapping[str, tuple[int, bytes]]) -> str:
    for address, (code, text) in recipients.items():
        return f"{address}: {code} {_text(text)}"
    return "no reason given"


def _text(data: bytes | str) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)
