"""Admission's shared bounds: while another sender is active, one already in flight gets only SENDER_SHARE of the
byte budget (and of the other bounds, through Senders.share)."""

from __future__ import annotations

import asyncio

import pytest

from appliance.clock import ManualClock
from appliance.errors import Overloaded
from appliance.serving.admission import ACTIVE_S, SENDER_SHARE, ByteBudget, Senders


def test_a_sender_already_in_flight_is_refused_at_its_share_and_a_newcomer_is_not() -> None:
    async def run() -> None:
        budget = ByteBudget(1000)
        async with budget.hold(500, wait=False):  # the flooder's first request: the whole budget applies
            with pytest.raises(Overloaded, match="kept for other senders") as refused:
                async with budget.hold(300, wait=False, share=SENDER_SHARE):  # 800 > 750
                    pass
            assert refused.value.reason == "SENDER_SHARE" and "server.inflight_bytes = 1000" in str(refused.value)
            with pytest.raises(Overloaded) as over:
                async with budget.hold(600, wait=False, share=SENDER_SHARE):  # 1100 > 1000: the budget itself
                    pass
            assert over.value.reason == "INFLIGHT_BYTES"
            async with budget.hold(200, wait=False, share=SENDER_SHARE):  # 700 <= 750
                async with budget.hold(300, wait=False):  # another sender's first request: 1000 <= 1000
                    assert budget.used == 1000
        assert budget.used == 0

    asyncio.run(run())


def test_a_waiting_sender_waits_for_its_share() -> None:
    async def run() -> None:
        budget = ByteBudget(1000)
        order: list[str] = []

        async def second() -> None:
            async with budget.hold(400, wait=True, share=SENDER_SHARE):  # 600 + 400 > 750: waits
                order.append("second in")

        async with budget.hold(600, wait=False):
            task = asyncio.ensure_future(second())
            await asyncio.sleep(0.05)
            assert order == []
        await asyncio.wait_for(task, 5)
        assert order == ["second in"] and budget.used == 0

    asyncio.run(run())


def test_senders_share_applies_only_while_another_sender_is_active() -> None:
    clock = ManualClock(100.0)
    senders = Senders(clock)
    a, b = "ipv4:10.0.0.1:5000", "ipv4:10.0.0.2:5000"
    assert senders.share(a) == 1.0
    with senders.count(a):
        assert senders.share(a) == 1.0  # alone: a client may use every bound
        with senders.count(b):
            assert senders.share(a) == SENDER_SHARE  # another client is in flight
            assert senders.share(b, counted=True) == 1.0  # its first request: nothing else of its own in flight
            assert senders.share(b) == SENDER_SHARE  # a second one, with a in flight
            with pytest.raises(RuntimeError), senders.count(b):
                assert senders.share(b, counted=True) == SENDER_SHARE
                raise RuntimeError("a failed request is uncounted too")
        clock.advance(ACTIVE_S - 0.1)
        assert senders.share(a) == SENDER_SHARE  # b was seen lately (refused, or answered): still active
        clock.advance(0.2)
        assert senders.share(a) == 1.0  # b has gone quiet
        assert senders.share("", counted=False) == 1.0  # an unknown sender is never limited
    with senders.count(a):  # arriving again forgets the senders long gone
        assert list(senders._seen) == [a]
    assert not senders._in_flight


@pytest.mark.parametrize(("peer", "sender"), [
    ("ipv4:10.0.0.5:40000", "ipv4:10.0.0.5"), ("ipv4:10.0.0.5:40001", "ipv4:10.0.0.5"),
    ("ipv6:[fd00::5]:443", "ipv6:[fd00::5]"), ("ipv6:%5Bfd00::5%5D:443", "ipv6:[fd00::5]"),
    ("ipv6:[::ffff:10.0.0.9]:80", "ipv6:[::ffff:10.0.0.9]"),
    ("ipv4:127.0.0.1:5000", "ipv4:127.0.0.1:5000"), ("ipv6:[::1]:5000", "ipv6:[::1]:5000"),
    ("ipv6:%5B::1%5D:5000", "ipv6:%5B::1%5D:5000"), ("unix:", "unix:"), ("", "")])
def test_a_remote_host_is_one_sender_whatever_its_connections(peer: str, sender: str) -> None:
    """Held-out review, session 18: a flooder opening one connection per call was never in flight twice, so it got
    around the sender share and took turns as many senders. Local peers stay one connection each."""
    from appliance.serving.admission import sender_of

    assert sender_of(peer) == sender


def test_many_connections_from_one_host_share_one_senders_share() -> None:
    from appliance.serving.admission import sender_of

    senders = Senders(ManualClock(100.0))
    flooder = [sender_of(f"ipv4:10.0.0.5:{40000 + i}") for i in range(3)]
    with senders.count(flooder[0]), senders.count(sender_of("ipv4:10.0.0.7:5000")):
        assert senders.share(flooder[1]) == SENDER_SHARE  # its second connection is the same sender, in flight


def test_under_mutual_tls_the_client_certificate_is_the_sender() -> None:
    """Modalities behind one router share an address but not a certificate; one client on two addresses is one."""
    from appliance.serving.admission import sender_of

    def auth(subject: bytes | None, kind: bytes = b"ssl") -> dict[str, list[bytes]]:
        return {"transport_security_type": [kind], **({"x509_subject": [subject]} if subject else {})}

    ct1, ct2 = auth(b"CN=ct-1,O=Hospital"), auth(b"CN=ct-2,O=Hospital")
    assert sender_of("ipv4:10.0.0.5:40000", ct1) != sender_of("ipv4:10.0.0.5:40001", ct2)
    assert sender_of("ipv4:10.0.0.5:40000", ct1) == sender_of("ipv4:10.0.0.6:40001", ct1)
    assert sender_of("ipv4:127.0.0.1:5000", ct1) == sender_of("ipv4:127.0.0.1:5001", ct1)
    # no client certificate (plain TLS), or no TLS: the address, as before
    assert sender_of("ipv4:10.0.0.5:40000", auth(None)) == "ipv4:10.0.0.5"
    assert sender_of("ipv4:10.0.0.5:40000", {}) == "ipv4:10.0.0.5"
    assert sender_of("ipv4:10.0.0.5:40000", auth(b"CN=x", b"insecure")) == "ipv4:10.0.0.5"
