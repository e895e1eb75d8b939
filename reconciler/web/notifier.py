"""Sends the notices outbox: an email with a signed link to a member, a message with buttons to Slack.

`handler up` runs one `Notifier` beside its HTTP listener, since the links and buttons lead back to
it. It claims the due notices of the channels it has settings for (`HANDLER_SMTP_URL`,
`HANDLER_SLACK_TOKEN`); a notice of a channel that is not configured here is stored `unsent`, with
the reason (`missing`), and is sent by a notifier that has the channel while its hold waits. A
failed send is retried with a growing delay (see `governance.notices`); one that cannot work (a
recipient or channel refused for good) is failed at once. Log lines name the hold, the channel
and the error, never the call's arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from reconciler.governance.alerts import ALERT_PREFIX, get_alert
from reconciler.governance.holds import Hold, get_hold
from reconciler.governance.notices import (
    Notice,
    claim_decided,
    claim_due,
    mark_failed,
    mark_sent,
    mark_skipped,
    mark_unsendable,
)
from reconciler.governance.store import Store
from reconciler.web.links import LinkSigner
from reconciler.web.mail import MailError, MailSettings, alert_message, approval_message, send_mail
from reconciler.web.slack import SlackClient, SlackError

__all__ = ["Notifier", "decision_text"]

log = logging.getLogger("handler.notify")


@dataclass
class Notifier:
    store: Store
    signer: LinkSigner
    public_url: str
    mail: MailSettings | None = None
    slack: SlackClient | None = None
    poll_seconds: float = 5.0  # a backstop: holds stored by this router, or announced by PostgreSQL, wake it
    _wake: asyncio.Event | None = field(default=None, init=False, repr=False)

    @property
    def channels(self) -> list[str]:
        return [name for name, on in (("email", self.mail is not None), ("slack", self.slack is not None)) if on]

    @property
    def missing(self) -> dict[str, str]:
        """The channels this notifier cannot send on, each with the setting that would change it."""
        missing = {}
        if self.mail is None:
            missing["email"] = "HANDLER_SMTP_URL is not set"
        if self.slack is None:
            missing["slack"] = "HANDLER_SLACK_TOKEN is not set"
        return missing

    def wake(self) -> None:
        """A hold was just stored: look at the outbox now (call on the event loop)."""
        if self._wake is not None:
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Send what is due until `stop` is set; look again every `poll_seconds`, or at once when woken."""
        self._wake = asyncio.Event()
        stopping = asyncio.create_task(stop.wait())
        stopping.add_done_callback(lambda _: self.wake())
        try:
            await self._mark_unsendable()
            while not stop.is_set():
                self._wake.clear()
                try:
                    busy = await self.send_due()
                except Exception:  # the store is unreachable for a moment: the notices wait there
                    log.exception("notices: cannot read the outbox; trying again")
                    busy = 0
                if not busy:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
        finally:
            stopping.cancel()

    async def _mark_unsendable(self) -> None:
        """Notices queued before (by a router that did not know) on channels this one cannot send on."""
        try:
            count = await asyncio.to_thread(mark_unsendable, self.store, self.missing)
        except Exception:  # the store is unreachable for a moment: they are marked at the next start
            log.exception("notices: cannot mark the notices no channel here sends")
            return
        if count:
            log.warning("%d notices wait on channels not configured here (%s): marked unsent", count,
                        "; ".join(f"{c}: {why}" for c, why in sorted(self.missing.items())))

    async def send_due(self) -> int:
        """Claim and send the notices due now, and show decisions in the Slack messages; how many were handled."""
        due = await asyncio.to_thread(claim_due, self.store, self.channels)
        for notice in due:
            await self._send(notice)
        closed = []
        if self.slack is not None:
            closed = await asyncio.to_thread(claim_decided, self.store, "slack")
            for notice in closed:
                hold = await asyncio.to_thread(get_hold, self.store, notice.hold_id)
                await self.slack.show_decision(notice.ref or "", decision_text(hold))
        return len(due) + len(closed)

    async def _send(self, notice: Notice) -> None:
        if notice.hold_id.startswith(ALERT_PREFIX):
            await self._send_alert(notice)
            return
        hold = await asyncio.to_thread(get_hold, self.store, notice.hold_id)
        if hold.state != "pending":
            await asyncio.to_thread(mark_skipped, self.store, notice, f"the hold was {hold.state} before it was sent")
            return
        try:
            if notice.channel == "email" and self.mail is not None:
                link = self.signer.url(self.public_url, hold.id, notice.member or "")
                message = approval_message(hold, link, self.mail.sender, notice.target)
                await asyncio.to_thread(send_mail, self.mail, message)
                ref = None
            elif notice.channel == "slack" and self.slack is not None:
                details = f"{self.public_url.rstrip('/')}/approvals/{hold.id}"
                ref = await self.slack.post_hold(notice.target, hold, details)
            else:  # pragma: no cover - claim_due only hands out the channels this notifier has
                return
        except (MailError, SlackError) as exc:
            wait = exc.retry_after if isinstance(exc, SlackError) else None
            state = await asyncio.to_thread(mark_failed, self.store, notice, str(exc), final=exc.permanent,
                                            not_before=wait)
            log.warning("notice of hold %s to %s %s failed (%s): %s", hold.id, notice.channel, notice.target,
                        "given up" if state == "failed" else "will retry", exc)
            return
        await asyncio.to_thread(mark_sent, self.store, notice, ref)
        log.info("notice of hold %s sent to %s %s", hold.id, notice.channel, notice.target)


    async def _send_alert(self, notice: Notice) -> None:
        """An owner's notice of a binding that cannot start (`governance.alerts`): email only, as owners are reached."""
        alert = await asyncio.to_thread(get_alert, self.store, notice.hold_id)
        if alert is None or notice.channel != "email" or self.mail is None:
            await asyncio.to_thread(mark_skipped, self.store, notice, "nothing to send it on")
            return
        try:
            message = alert_message(alert, self.mail.sender, notice.target, self.public_url)
            await asyncio.to_thread(send_mail, self.mail, message)
        except MailError as exc:
            state = await asyncio.to_thread(mark_failed, self.store, notice, str(exc), final=exc.permanent)
            log.warning("notice of %s to %s failed (%s): %s", alert.id, notice.target,
                        "given up" if state == "failed" else "will retry", exc)
            return
        await asyncio.to_thread(mark_sent, self.store, notice, None)
        log.info("notice of %s (binding %s) sent to %s", alert.id, alert.binding, notice.target)


def decision_text(hold: Hold) -> str:
    """One line for a channel: what became of the hold, and who decided."""
    verb = {"rejected": "Rejected"}.get(hold.state, "Approved")
    by = f" by {hold.decided_by}" if hold.decided_by else ""
    why = f" — {hold.decision_reason}" if hold.state == "rejected" and hold.decision_reason else ""
    return f"{verb}{by}: {hold.profile} · {hold.interface} {hold.tool} · request {hold.id}{why}"
