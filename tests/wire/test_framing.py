"""The one framer and the messages: lines under a cap, and the JSON-RPC error for each kind of bad message."""

from __future__ import annotations

import pytest

from reconciler.wire.errors import JsonRpcError
from reconciler.wire.framing import HEAD_BYTES, OVERSIZE, LineFramer, Oversize
from reconciler.wire.messages import IdentifiedError, Message, encode_raw_result, parse_message


def test_lines_are_cut_across_reads() -> None:
    framer = LineFramer(100)
    assert framer.feed(b'{"a":1}\n') == [b'{"a":1}\n']
    assert framer.feed(b'{"b"') == []
    assert framer.feed(b':2}\n{"c":3}\n{"d"') == [b'{"b":2}\n', b'{"c":3}\n']
    assert framer.feed(b":4}\n") == [b'{"d":4}\n']


def _shown(items: list[bytes | Oversize]) -> list[object]:
    return [("oversize", item.data) if isinstance(item, Oversize) else item for item in items]


def test_an_oversize_line_is_reported_once_with_its_start_and_skipped_to_its_end() -> None:
    framer = LineFramer(10)
    assert _shown(framer.feed(b"x" * 11)) == [("oversize", b"x" * 11)]
    assert framer.feed(b"x" * 50) == []
    assert framer.feed(b'xx\n{"ok":1}\n') == [b'{"ok":1}\n']
    assert _shown(framer.feed(b"y" * 20 + b"\nz\n")) == [("oversize", b"y" * 20 + b"\n"), b"z\n"]
    assert LineFramer(10).feed(b"0123456789\n") == [b"0123456789\n"]  # exactly the cap passes


def test_only_the_start_of_an_oversize_line_is_kept() -> None:
    framer = LineFramer(1000)
    (item,) = framer.feed(b'{"jsonrpc":"2.0","id":7,"result":"' + b"z" * 5000)
    assert isinstance(item, Oversize)
    assert item.data.startswith(b'{"jsonrpc":"2.0","id":7,')
    assert len(item.data) == HEAD_BYTES
    assert OVERSIZE.data == b""


def test_in_pass_mode_an_oversize_line_comes_out_in_pieces_and_nothing_is_held() -> None:
    framer = LineFramer(10, oversize="pass")
    pieces = framer.feed(b"x" * 11)
    assert [type(p) for p in pieces] == [Oversize]
    assert pieces[0].data == b"x" * 11  # type: ignore[union-attr]
    assert framer.buffered == 0
    more = framer.feed(b"yy\nok\n")
    assert [p.data if isinstance(p, Oversize) else p for p in more] == [b"yy\n", b"ok\n"]
    assert framer.feed(b"tail") == []
    assert framer.take_rest() == b"tail"
    assert framer.buffered == 0


def test_a_framer_never_buffers_more_than_its_limit() -> None:
    framer = LineFramer(1000)
    for _ in range(100):
        framer.feed(b"z" * 999)
        assert framer.buffered <= 1000


@pytest.mark.parametrize(("line", "code", "reply_id"), [
    (b"nope", -32700, None),
    (b"[]", -32600, None),
    (b"3", -32600, None),
    (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', -32600, 1),
    (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":"a","method":3}', -32600, "a"),
    (b'{"jsonrpc":"2.0","id":"a","method":"x","params":"p"}', -32600, "a"),
    (b'{"jsonrpc":"2.0","method":"tools/call"}', -32600, None),
])
def test_bad_messages_get_the_right_error(line: bytes, code: int, reply_id: object) -> None:
    with pytest.raises(JsonRpcError) as raised:
        parse_message(line)
    assert raised.value.code == code
    assert (raised.value.msg_id if isinstance(raised.value, IdentifiedError) else None) == reply_id


@pytest.mark.parametrize(("sent", "said"), [
    (b"null", "this one is null"), (b"true", "this one is a boolean"), (b"1.5", "a number with a fraction"),
    (b"123456789012345678901234567890", "beyond 64 bits"), (b'{"a":1}', "this one is an object"),
    (b"[1]", "this one is an array"),
])
def test_a_bad_request_id_is_named_for_what_it_is(sent: bytes, said: str) -> None:
    with pytest.raises(JsonRpcError) as raised:
        parse_message(b'{"jsonrpc":"2.0","id":' + sent + b',"method":"ping"}')
    assert "must be a string or an integer" in raised.value.message
    assert said in raised.value.message


def test_requests_notifications_and_responses() -> None:
    assert parse_message(b'{"jsonrpc":"2.0","id":0,"method":"ping"}') == Message("ping", None, 0, True)
    note = parse_message(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert note == Message("notifications/initialized", None, None, False)
    assert parse_message(b'{"jsonrpc":"2.0","id":4,"result":{}}') is None


def test_a_preserialized_result_is_spliced_with_its_id() -> None:
    assert encode_raw_result("a", b'{"tools":[]}') == b'{"jsonrpc":"2.0","id":"a","result":{"tools":[]}}\n'
