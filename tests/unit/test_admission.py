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
