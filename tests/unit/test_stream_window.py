"""A stream's frame window: an item's frames are given back however the item ends, even while it still waits."""

from __future__ import annotations

import asyncio

import pytest

from appliance.errors import Unavailable
from appliance.serving.server import FrameShare, FrameWindow


def test_frames_an_ended_item_gets_after_it_ended_go_straight_back() -> None:
    async def scenario() -> None:
        window = FrameWindow(4)
        first, second = FrameShare(window), FrameShare(window)
        await first.take(4)  # the whole window
        waiting = asyncio.create_task(second.take(4))
        await asyncio.sleep(0)
        assert not waiting.done()
        await second.close()  # its deadline passed while it waited: the item is answered and gone
        await first.close()  # now the window opens, and the waiting admission gets its frames ...
        with pytest.raises(Unavailable, match="ended while it waited"):
            await waiting
        assert window._used == 0  # ... and gives them back at once
        third = FrameShare(window)
        await asyncio.wait_for(third.take(4), 1.0)  # a later item of the stream still gets the whole window
        await third.close()
        assert window._used == 0

    asyncio.run(scenario())


def test_an_item_gives_back_what_it_holds_once() -> None:
    async def scenario() -> None:
        window = FrameWindow(8)
        share = FrameShare(window)
        await share.take(3)
        assert window._used == 3
        await share.close()
        await share.close()
        assert window._used == 0

    asyncio.run(scenario())
