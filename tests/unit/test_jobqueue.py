"""The worker queue's order: INTERACTIVE first; within a class the senders take turns, oldest first per sender."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from appliance.batching.work import Priority
from appliance.workers.jobqueue import INTERACTIVE_RUN, JobQueue


@dataclass(eq=False)
class J:
    name: str
    source: str
    priority: Priority = Priority.BATCH


def _order(q: JobQueue[J]) -> list[str]:
    return [j.name for j in q.drain()]


def test_a_flood_from_one_sender_lets_the_other_senders_through_in_turn() -> None:
    q: JobQueue[J] = JobQueue()
    for i in range(5):
        q.push(J(f"a{i}", "ipv4:10.0.0.1:40000"))
    q.push(J("b0", "ipv4:10.0.0.2:40000"))
    q.push(J("b1", "ipv4:10.0.0.2:40000"))
    q.push(J("c0", "unix:"))
    assert len(q) == 8
    assert _order(q) == ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]
    assert len(q) == 0 and q.pop() is None


def test_interactive_first_and_one_sender_is_plain_fifo() -> None:
    q: JobQueue[J] = JobQueue()
    for name, prio in (("b1", Priority.BATCH), ("i1", Priority.INTERACTIVE), ("b2", Priority.BATCH),
                       ("i2", Priority.INTERACTIVE)):
        q.push(J(name, "", prio))
    assert _order(q) == ["i1", "i2", "b1", "b2"]


def test_remove_takes_a_queued_job_out_and_forgets_an_empty_sender() -> None:
    q: JobQueue[J] = JobQueue()
    a, b, c = J("a", "x"), J("b", "y"), J("c", "x")
    for j in (a, b, c):
        q.push(j)
    assert q.remove(b) and not q.remove(b)
    assert q.remove(a)
    assert len(q) == 1
    q.push(J("d", "y"))
    assert _order(q) == ["c", "d"]
    assert not q.remove(c)  # already taken


def _classes_in_order(interactive: int, batch: int) -> list[Priority]:
    """INTERACTIVE first, except that after INTERACTIVE_RUN of them in a row a waiting BATCH job gets a turn."""
    out, run = [], 0
    while interactive or batch:
        if interactive and (not batch or run < INTERACTIVE_RUN):
            out.append(Priority.INTERACTIVE)
            interactive -= 1
            run = run + 1 if batch else 0
        else:
            out.append(Priority.BATCH)
            batch -= 1
            run = 0
    return out


def test_a_flood_of_interactive_jobs_leaves_batch_jobs_a_share() -> None:
    """Held-out review, session 18: strictly first, INTERACTIVE work (proto3's default) starved BATCH completely."""
    q: JobQueue[J] = JobQueue()
    for k in range(12):
        q.push(J(f"i{k}", f"client{k % 3}", Priority.INTERACTIVE))
    for k in range(3):
        q.push(J(f"b{k}", "batch", Priority.BATCH))
    assert _order(q) == ["i0", "i1", "i2", "i3", "b0", "i4", "i5", "i6", "i7", "b1", "i8", "i9", "i10", "i11", "b2"]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(list(Priority))), max_size=40))
def test_every_job_comes_out_once_priority_first_and_in_order_per_sender(jobs) -> None:
    q: JobQueue[J] = JobQueue()
    pushed = [J(f"{s}{i}", s, p) for i, (s, p) in enumerate(jobs)]
    for j in pushed:
        q.push(j)
    out = q.drain()
    assert sorted(j.name for j in out) == sorted(j.name for j in pushed)
    counts = [sum(j.priority == p for j in pushed) for p in (Priority.INTERACTIVE, Priority.BATCH)]
    assert [j.priority for j in out] == _classes_in_order(*counts)
    for sender in "abc":
        for p in Priority:
            mine = [j for j in pushed if j.source == sender and j.priority == p]
            assert [j for j in out if j.source == sender and j.priority == p] == mine
    # within a class, no sender gets a second turn while another sender still waits for its first
    for p in Priority:
        seq = [j.source for j in out if j.priority == p]
        waiting = {s: seq.count(s) for s in set(seq)}
        turns = min(waiting.values(), default=0)
        assert all(len(set(seq[k * len(waiting):(k + 1) * len(waiting)])) == len(waiting) for k in range(turns))


def test_ahead_counts_the_jobs_a_new_one_waits_behind() -> None:
    q: JobQueue[J] = JobQueue()
    for k in range(6):
        q.push(J(f"b{k}", "flood", Priority.BATCH))
    q.push(J("i0", "x", Priority.INTERACTIVE))
    q.push(J("i1", "y", Priority.INTERACTIVE))
    assert q.ahead(Priority.INTERACTIVE, "z") == 2  # the two INTERACTIVE senders; BATCH's turn comes after four
    assert q.ahead(Priority.BATCH, "flood") == 6 + 2  # its own six, and the INTERACTIVE jobs take their turns too
    assert q.ahead(Priority.BATCH, "other") == 1 + 2  # a new sender waits for one turn of the flood's


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(list(Priority))), max_size=30),
       st.integers(0, 10), st.sampled_from("abcd"), st.sampled_from(list(Priority)))
def test_ahead_never_counts_more_jobs_than_really_go_first(jobs, pops, source, priority) -> None:
    """A lower bound: the deadline refusal built on it must never refuse a request that would have made it."""
    q: JobQueue[J] = JobQueue()
    for i, (s, p) in enumerate(jobs):
        q.push(J(f"{s}{i}", s, p))
    for _ in range(pops):  # some taken already: the turn order and the class run are mid-way
        q.pop()
    ahead = q.ahead(priority, source)
    new = J("new", source, priority)
    q.push(new)
    assert ahead <= q.drain().index(new)
