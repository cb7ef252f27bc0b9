"""Proof waiters (`server.tlog.waiters`): a waiter costs no lookup
while nothing is published, all of a process's waiters are looked up together when a
checkpoint is, and their number is bounded in all and per client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import pytest

from server.tlog.proofs import Located
from server.tlog.waiters import ProofWaiters, TooManyWaiters, Waiter


class Log:
    """A log's published size and its stamps' places, as a real database would answer; counts
    the lookups."""

    def __init__(self) -> None:
        self.size: int | None = None
        self.serials: dict[int, Located] = {}
        self.objects: dict[str, Located] = {}
        self.lookups: list[tuple[tuple[int, ...], tuple[str, ...]]] = []

    def published_size(self) -> int | None:
        return self.size

    def find(self, serials: Sequence[int], objects: Sequence[str]
             ) -> tuple[dict[int, Located], dict[str, Located]]:
        self.lookups.append((tuple(serials), tuple(objects)))
        return ({s: self.serials[s] for s in serials if s in self.serials},
                {o: self.objects[o] for o in objects if o in self.objects})


async def settle(waiters: ProofWaiters) -> None:
    """Until the waiters' task has looked at everything it was given."""
    for _ in range(1000):
        await asyncio.sleep(0)
        if waiters._task is None:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the waiters' task did not end")


def woken(ws: list[Waiter]) -> list[int]:
    """The positions of the woken waiters of ``ws``; rearms them."""
    out = [i for i, w in enumerate(ws) if w.woken.done()]
    for w in ws:
        w.rearm()
    return out


def test_waiters_are_looked_up_together_and_then_only_when_a_checkpoint_grows() -> None:
    async def main() -> None:
        log = Log()
        log.size = 10
        log.serials = {100 + i: Located(100 + i, None) for i in range(800)}  # not sequenced
        log.serials[7] = Located(7, 12)  # sequenced, not covered by size 10
        log.serials[8] = Located(8, 3)  # covered
        waiters = ProofWaiters(log.published_size, log.find, limit=5000, per_client=5000)
        waiters.published()
        with contextlib.ExitStack() as stack:
            # 2,002 arrive at once: one lookup for all of them, each woken once it is done.
            unknown = [stack.enter_context(waiters.waiting(b"c", None, f"{i:040x}"))
                       for i in range(1200)]
            pending = [stack.enter_context(waiters.waiting(b"c", 100 + i, None))
                       for i in range(800)]
            sequenced = [stack.enter_context(waiters.waiting(b"c", s, None)) for s in (7, 8)]
            every = [*unknown, *pending, *sequenced]
            await settle(waiters)
            assert len(log.lookups) == 1
            serials, objects = log.lookups[0]
            assert len(serials) == 802 and len(objects) == 1200
            assert len(woken(every)) == len(every) and all(w.looked for w in every)
            assert sequenced[1].covered(10) and not sequenced[0].covered(10)
            # Time passes, nothing is published: no lookup at all.
            await asyncio.sleep(0.05)
            # The checkpoint file changed without growing (cosignatures added): none either.
            waiters.published()
            await settle(waiters)
            assert len(log.lookups) == 1 and woken(every) == []
            # A checkpoint of size 13: one sweep. The sequenced one is woken without a lookup;
            # the others still without an entry are looked up together.
            log.serials[100] = Located(100, 11)  # sequenced, covered now
            log.serials[101] = Located(101, 20)  # sequenced, not covered yet
            log.serials[102] = Located(102, None, failed=True)
            log.objects[f"{5:040x}"] = Located(55, 12)
            log.size = 13
            waiters.published()
            await settle(waiters)
            assert len(log.lookups) == 2
            serials, objects = log.lookups[1]
            assert len(serials) == 800 and len(objects) == 1200  # (7 and 8 are not asked)
            # (the sequenced ones: 7 covered now; 8 again, in the test only: a real waiter
            # is answered and gone once covered)
            assert woken(every) == [5, 1200, 1202, 2000, 2001]
            assert pending[1].located == Located(101, 20) and pending[2].located is not None
            assert unknown[5].located == Located(55, 12)
            # The next sweep asks only for those whose entry is still to come.
            log.size = 21
            waiters.published()
            await settle(waiters)
            assert len(log.lookups) == 3
            serials, objects = log.lookups[2]
            assert len(serials) == 797 and len(objects) == 1199
            assert woken(every) == [5, 1200, 1201, 2000, 2001]
        assert len(waiters) == 0

    asyncio.run(main())


def test_an_unknown_serial_is_told_at_once() -> None:
    async def main() -> None:
        log = Log()
        waiters = ProofWaiters(log.published_size, log.find, limit=10, per_client=10)
        with waiters.waiting(b"a", 99, None) as w:
            await settle(waiters)
            assert w.woken.done() and w.unknown and not w.pending

    asyncio.run(main())


def test_waiters_are_bounded_in_all_and_per_client() -> None:
    async def main() -> None:
        log = Log()
        waiters = ProofWaiters(log.published_size, log.find, limit=3, per_client=2)
        with waiters.waiting(b"a", 1, None), waiters.waiting(b"a", 2, None):
            with pytest.raises(TooManyWaiters, match="this client has 2"), \
                    waiters.waiting(b"a", 3, None):
                pass
            with waiters.waiting(b"b", 4, None), \
                    pytest.raises(TooManyWaiters, match="3 proof requests are waiting"), \
                    waiters.waiting(b"c", 5, None):
                pass
            assert waiters.stats.proof_waiters_refused == 2
        # Once they are gone, there is room again.
        with waiters.waiting(b"a", 6, None), waiters.waiting(b"a", 7, None):
            assert len(waiters) == 2
        assert len(waiters) == 0 and not waiters._clients

    asyncio.run(main())


def test_a_failing_lookup_wakes_the_arrivals_to_look_for_themselves() -> None:
    async def main() -> None:
        calls = []

        def find(serials: Sequence[int], objects: Sequence[str]
                 ) -> tuple[dict[int, Located], dict[str, Located]]:
            calls.append(serials)
            raise OSError("database gone")

        waiters = ProofWaiters(lambda: 5, find, limit=10, per_client=10)
        with waiters.waiting(b"a", 1, None) as w:
            await settle(waiters)
            assert calls and w.woken.done() and not w.looked
            assert waiters._task is None  # (the next arrival or publication looks again)

    asyncio.run(main())
