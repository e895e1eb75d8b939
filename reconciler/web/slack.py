"""The Slack channel: post a hold to a channel with Approve and Reject buttons, and read the clicks.

Posting uses the Web API's `chat.postMessage` with a bot token (`HANDLER_SLACK_TOKEN`); Slack's
interactivity then POSTs each click to `/hooks/slack`, signed with the app's signing secret
(`HANDLER_SLACK_SIGNING_SECRET`): `verify_request` checks that signature and refuses a request
more than five minutes old, so a captured one cannot be replayed. `HANDLER_SLACK_API_URL` points
the client elsewhere than `https://slack.com/api` (a proxy, or a local server in tests).

The message names who asks for what and at which estimated cost; the call's arguments stay on the
dashboard page the Details button opens, since a channel has many readers.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import httpx
import orjson

from reconciler.config.errors import HandlerError
from reconciler.governance.holds import Hold
from reconciler.governance.rulebook import from_micros
from reconciler.web.links import epoch_seconds

__all__ = ["APPROVE", "REJECT", "SlackAction", "SlackClient", "SlackError", "SlackSettings", "hold_blocks",
           "parse_interaction", "verify_request"]

APPROVE = "handler_approve"
REJECT = "handler_reject"
MAX_AGE_SECONDS = 300
_DEFAULT_API = "https://slack.com/api"


class SlackError(HandlerError):
    """Slack refused or could not be reached; `permanent` when a retry cannot help (a wrong channel)."""

    def __init__(self, message: str, *, permanent: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


# Errors of chat.postMessage that the same request will get again.
_PERMANENT = frozenset({"channel_not_found", "not_in_channel", "is_archived", "invalid_auth", "not_authed",
                        "account_inactive", "token_revoked", "missing_scope", "invalid_blocks", "msg_too_long"})


@dataclass(frozen=True, slots=True)
class SlackSettings:
    token: str | None
    signing_secret: bytes | None
    api_url: str = _DEFAULT_API

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlackSettings:
        secret = env.get("HANDLER_SLACK_SIGNING_SECRET", "").strip()
        return cls(env.get("HANDLER_SLACK_TOKEN", "").strip() or None, secret.encode() if secret else None,
                   env.get("HANDLER_SLACK_API_URL", "").strip().rstrip("/") or _DEFAULT_API)


@dataclass(frozen=True, slots=True)
class SlackAction:
    """One click on a hold's button."""

    user_id: str
    user_name: str
    decision: str  # approve | reject
    hold_id: str
    response_url: str | None


def hold_blocks(hold: Hold, details_url: str) -> list[dict[str, Any]]:
    """The message: who asks for what, why it waits, and the buttons."""
    summary = (f"*Approval needed* — agent profile *{hold.profile}* (instance `{hold.instance}`) asks to run "
               f"`{hold.interface}` *{hold.tool}*, estimated ${from_micros(hold.cost):.4f}.\n{hold.reason}")
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": summary}},
        {"type": "actions", "block_id": f"hold:{hold.id}", "elements": [
            {"type": "button", "action_id": APPROVE, "style": "primary", "value": hold.id,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": REJECT, "style": "danger", "value": hold.id,
             "text": {"type": "plain_text", "text": "Reject"}},
            {"type": "button", "action_id": "handler_details", "url": details_url,
             "text": {"type": "plain_text", "text": "Details"}},
        ]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": f"request `{hold.id}`"}]},
    ]


class SlackClient:
    def __init__(self, settings: SlackSettings, client: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._client = client or httpx.AsyncClient(timeout=15.0)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def post_hold(self, channel: str, hold: Hold, details_url: str) -> str:
        """Post the hold to `channel`; "<channel id> <ts>", Slack's id of the message. Raises `SlackError`."""
        if not self._settings.token:
            raise SlackError("Slack is off: set HANDLER_SLACK_TOKEN to a bot token with chat:write")
        body = {"channel": channel, "text": f"Approval needed: {hold.profile} wants to run {hold.tool} ({hold.id})",
                "blocks": hold_blocks(hold, details_url), "unfurl_links": False}
        try:
            reply = await self._client.post(f"{self._settings.api_url}/chat.postMessage", content=orjson.dumps(body),
                                            headers={"Authorization": f"Bearer {self._settings.token}",
                                                     "Content-Type": "application/json; charset=utf-8"})
        except httpx.HTTPError as exc:
            raise SlackError(f"cannot reach Slack at {self._settings.api_url}: {exc}") from None
        if reply.status_code == 429:
            retry = reply.headers.get("retry-after", "")
            wait = float(retry) if retry.isascii() and retry.isdigit() else None
            raise SlackError("Slack is rate limiting this app", retry_after=wait)
        try:
            data = reply.json()
        except ValueError:
            raise SlackError(f"Slack answered HTTP {reply.status_code} without JSON") from None
        if not isinstance(data, dict) or not data.get("ok"):
            error = str(data.get("error", f"HTTP {reply.status_code}")) if isinstance(data, dict) else "?"
            raise SlackError(f"Slack refused the message to {channel}: {error}", permanent=error in _PERMANENT)
        return f"{data.get('channel', '')} {data.get('ts', '')}"

    async def show_decision(self, ref: str, text: str) -> None:
        """Replace a posted hold's message (its `ref`, "<channel id> <ts>") with the decision, buttons gone."""
        channel, _, ts = ref.partition(" ")
        if not (self._settings.token and channel and ts):
            return
        body = {"channel": channel, "ts": ts, "text": text,
                "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]}
        with contextlib.suppress(httpx.HTTPError):  # the decision stands; only the message stays as it was
            await self._client.post(f"{self._settings.api_url}/chat.update", content=orjson.dumps(body),
                                    headers={"Authorization": f"Bearer {self._settings.token}",
                                             "Content-Type": "application/json; charset=utf-8"})

    async def respond(self, response_url: str, text: str, *, replace: bool = True) -> None:
        """Answer a click through its `response_url`: replace the message with `text` (the decision), or,
        with `replace=False`, show `text` to the clicker alone."""
        body = {"replace_original": True, "text": text} if replace else {
            "replace_original": False, "response_type": "ephemeral", "text": text}
        # The decision stands; only the message stays as it was. InvalidURL: a response_url that is not a URL.
        with contextlib.suppress(httpx.HTTPError, httpx.InvalidURL):
            await self._client.post(response_url, json=body)


def verify_request(secret: bytes, timestamp: str | None, body: bytes, signature: str | None,
                   now: float | None = None) -> str | None:
    """None when Slack signed this request (v0, HMAC-SHA256) in the last five minutes; else why not."""
    if not timestamp or not signature:
        return "the request has no X-Slack-Request-Timestamp or X-Slack-Signature"
    sent = epoch_seconds(timestamp)
    if sent is None:
        return "X-Slack-Request-Timestamp is not a number"
    if abs((time.time() if now is None else now) - sent) > MAX_AGE_SECONDS:
        return "the request is more than five minutes old (a replay, or a clock far off)"
    expected = "v0=" + hmac.new(secret, b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):  # bytes: a str with "é" would raise
        return "the signature does not match HANDLER_SLACK_SIGNING_SECRET"
    return None


def parse_interaction(body: bytes) -> SlackAction:
    """The click in an interaction request (form-encoded `payload`); `ValueError` says what is missing."""
    try:
        payload = orjson.loads(parse_qs(body.decode())["payload"][0])
    except (KeyError, IndexError, UnicodeDecodeError, orjson.JSONDecodeError):
        raise ValueError("the request has no JSON `payload` form field") from None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        raise ValueError("only block_actions interactions are handled")
    actions = payload.get("actions")
    action = actions[0] if isinstance(actions, list) and actions and isinstance(actions[0], dict) else {}
    decision = {APPROVE: "approve", REJECT: "reject"}.get(str(action.get("action_id")))
    user: dict[str, Any] = payload["user"] if isinstance(payload.get("user"), dict) else {}
    if decision is None or not isinstance(action.get("value"), str) or not isinstance(user.get("id"), str):
        raise ValueError("the interaction is not a click on a hold's Approve or Reject button")
    response_url = payload.get("response_url")
    return SlackAction(user["id"], str(user.get("username") or user.get("name") or user["id"]), decision,
                       action["value"], response_url if isinstance(response_url, str) else None)
