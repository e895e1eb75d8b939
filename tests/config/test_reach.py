"""What an egress entry allows: host:port matching, which addresses are the internet, and a URL's reach."""

from __future__ import annotations

import pytest

from reconciler.config.reach import is_global_address, names_address, url_reach_problem


@pytest.mark.parametrize(("address", "public"), [
    ("8.8.8.8", True),
    ("2606:4700:4700::1111", True),
    ("127.0.0.1", False),
    ("10.1.2.3", False),
    ("172.16.0.1", False),
    ("192.168.1.1", False),
    ("169.254.169.254", False),  # a cloud's metadata service
    ("100.64.0.1", False),  # shared address space
    ("::1", False),
    ("fe80::1", False),
    ("fd00::1", False),
    ("::ffff:127.0.0.1", False),  # loopback dressed as IPv6
    ("::ffff:8.8.8.8", False),  # IPv4-mapped: a name's A record gives the plain address
    ("::ffff:0:8.8.8.8", False),  # IPv4-translated
    # NAT64, well-known and local-use prefixes: a translator carries them on to the IPv4 address inside, so neither
    # a loopback nor a public one inside makes them global (Python's is_global says True).
    ("64:ff9b::7f00:1", False),
    ("64:ff9b::a00:1", False),
    ("64:ff9b::808:808", False),
    ("64:ff9b:1::7f00:1", False),
    ("64:ff9b:1:ffff::808:808", False),
    ("::127.0.0.1", False),  # IPv4-compatible
    ("::8.8.8.8", False),
    ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1
    ("2002:808:808::1", False),  # 6to4 of 8.8.8.8
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
    ("2001::7f00:1", False),
    ("fec0::1", False),  # site-local
    ("fec0::7f00:1", False),
    ("2001:db8::1", False),  # documentation
    ("3fff::1", False),
    ("5f00::1", False),  # outside global unicast (segment routing identifiers)
    ("192.88.99.1", False),  # 6to4 relays' anycast
    ("2001:4860:4860::8888", True),
    ("2a00:1450:4001:800::200e", True),
    ("0.0.0.0", False),  # noqa: S104 - an address to classify, not one to bind
    ("224.0.0.1", False),
    ("not an address", False),
])
def test_which_addresses_count_as_the_public_internet(address: str, public: bool) -> None:
    assert is_global_address(address) is public


def test_only_an_ip_literal_entry_names_an_address() -> None:
    assert names_address(["127.0.0.1:2525"], "127.0.0.1", 2525)
    assert names_address(["127.0.0.1:*"], "127.0.0.1", 2525)
    assert names_address(["[::1]:2525"], "::1", 2525)
    assert not names_address(["127.0.0.1:2525"], "127.0.0.1", 25)
    assert not names_address(["localhost:2525"], "127.0.0.1", 2525)
    assert not names_address(["*:*"], "127.0.0.1", 2525)


@pytest.mark.parametrize(("url", "egress", "problem"), [
    ("https://api.openai.com", ["api.openai.com:443"], None),
    ("https://api.openai.com/v1", ["*:443"], None),
    ("http://gateway.example.org:8080", ["gateway.example.org:*"], None),
    ("http://127.0.0.1:18999", ["127.0.0.1:18999"], None),  # named exactly: the operator's word
    ("http://127.0.0.1:18999", ["api.openai.com:443"], "127.0.0.1:18999 is not in its egress (api.openai.com:443)"),
    ("https://api.openai.com:8443", ["api.openai.com:443"], "api.openai.com:8443 is not in its egress"),
    ("http://127.0.0.1:18999", ["*:*"], "127.0.0.1:18999 is an address of this machine or a private network"),
    ("http://[64:ff9b::7f00:1]:80", ["*:*"], "[64:ff9b::7f00:1]:80 is an address of this machine"),
    ("http://10.0.0.7:11434", ["*:11434"], "10.0.0.7:11434 is an address of this machine"),
    ("ftp://api.openai.com", ["*:*"], "is not an http or https URL with a host"),
    ("http://[::1", ["*:*"], "is not a URL"),
])
def test_a_urls_host_and_port_are_held_against_the_egress(url: str, egress: list[str], problem: str | None) -> None:
    found = url_reach_problem(egress, url)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found, found
