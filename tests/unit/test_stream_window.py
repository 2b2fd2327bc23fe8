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


def test_one_file_of_a_window_at_a_time_goes_to_a_worker_before_admission() -> None:
    """Held-out review, session 18: a file learns its frame count in a worker, then waits for the window holding that
    worker; a stream of 33-frame files parked both workers. The gate lets one file at a time go to a worker until it
    is admitted (what take returns is called: it may still wait in its worker for room in the inbox after take) or
    done (close), so a window parks one worker at most."""
    from appliance.errors import DeadlineExceeded

    async def scenario() -> None:
        window = FrameWindow(4)
        first, second, third = FrameShare(window), FrameShare(window), FrameShare(window)
        await first.enter(None)
        entering = asyncio.create_task(second.enter(None))
        await asyncio.sleep(0)
        assert not entering.done()  # the first file has not been admitted yet
        with pytest.raises(DeadlineExceeded, match="waited for its turn"):
            await third.enter(0.01)
        admitted = await first.take(4)  # its window frames; it may still wait for room in the inbox
        await asyncio.sleep(0)
        assert not entering.done()  # not admitted yet: the gate is still the first file's
        admitted()  # admitted: the next file may go to a worker (the window itself is full)
        await asyncio.wait_for(entering, 1.0)
        waiting = asyncio.create_task(second.take(4))  # parked until the first is done, holding the gate
        await asyncio.sleep(0)
        await first.close()
        await asyncio.wait_for(waiting, 1.0)
        await second.close()
        await asyncio.wait_for(third.enter(None), 1.0)  # every gate given back
        await third.close()
        assert window._used == 0

    asyncio.run(scenario())
