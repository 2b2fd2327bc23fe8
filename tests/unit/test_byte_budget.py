"""The in-flight byte budget (server.inflight_bytes): a sender already in flight gets only SENDER_SHARE of it."""

from __future__ import annotations

import asyncio

import pytest

from appliance.errors import Overloaded
from appliance.serving.admission import SENDER_SHARE, ByteBudget


def test_a_sender_already_in_flight_is_refused_at_its_share_and_a_newcomer_is_not() -> None:
    async def run() -> None:
        budget = ByteBudget(1000)
        async with budget.hold(500, wait=False):  # the flooder's first request: the whole budget applies
            with pytest.raises(Overloaded, match="kept for other senders") as refused:
                async with budget.hold(300, wait=False, share=SENDER_SHARE):  # 800 > 750
                    pass
            assert refused.value.reason == "INFLIGHT_BYTES" and "server.inflight_bytes = 1000" in str(refused.value)
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
