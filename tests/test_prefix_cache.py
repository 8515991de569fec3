"""The prefix cache's block pool: sharing, reference counts, LRU eviction (issue 15, step 1)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simsim.engines.prefix_cache import BlockTable, PrefixCache


def chain(*parts: str) -> tuple[str, ...]:
    """Chained keys: block i's key names the whole prefix up to it."""
    return tuple("/".join(parts[: i + 1]) for i in range(len(parts)))


def test_a_shared_prefix_is_held_once_and_cached_after_its_last_holder() -> None:
    pool = PrefixCache(8)
    first = pool.acquire(chain("s", "a"), 0, 3)  # nothing cached yet: 3 new blocks
    pool.publish(first, chain("s", "a"))  # its two full prompt blocks get their names
    assert (first.blocks, len(first.named), first.anonymous) == (3, 2, 1)
    assert pool.match(chain("s", "b")) == 1  # the system prompt's block is shared
    second = pool.acquire(chain("s", "b"), 1, 2)
    assert pool.used_blocks == 5 and pool.free_blocks == 3
    pool.release(first)
    assert pool.cached_blocks == 1  # "s/a": "s" is still held by the second request
    pool.release(second)
    assert pool.cached_blocks == 2 and pool.free_blocks == 6
    assert pool.match(chain("s", "a")) == 2


def test_eviction_takes_free_blocks_first_then_the_oldest_release_deepest_first() -> None:
    pool = PrefixCache(4)
    table = pool.acquire(chain("x", "y", "z"), 0, 3)
    pool.publish(table, chain("x", "y", "z"))
    pool.release(table)  # cached in order: z (deepest) first, then y, then x
    assert (pool.free_blocks, pool.cached_blocks) == (1, 3)
    other = pool.acquire(("q",), 0, 2)  # the free block, then evict "x/y/z"
    assert pool.match(chain("x", "y", "z")) == 2
    pool.grow(other)  # evicts "x/y"
    assert pool.match(chain("x", "y", "z")) == 1
    assert pool.available_blocks == 1


def test_a_matched_cached_block_stops_being_evictable() -> None:
    pool = PrefixCache(3)
    table = pool.acquire(chain("p", "q"), 0, 2)
    pool.publish(table, chain("p", "q"))
    pool.release(table)
    assert pool.needed(chain("p", "q"), 2) == 2  # both must leave the LRU list
    again = pool.acquire(chain("p", "q"), 2, 1)
    assert (pool.cached_blocks, pool.free_blocks, pool.available_blocks) == (0, 0, 0)
    with pytest.raises(ValueError, match="1 new block does not fit: 0 available"):
        pool.grow(again)
    with pytest.raises(ValueError, match="do not fit"):
        pool.acquire(("r",), 0, 1)


def test_bad_calls_change_nothing() -> None:
    pool = PrefixCache(2)
    with pytest.raises(ValueError, match="only 0 of the 1 block is held"):
        pool.acquire(("a",), 1, 0)
    with pytest.raises(ValueError, match="do not fit"):
        pool.acquire(("a",), 0, 3)
    assert pool.free_blocks == 2 and pool.used_blocks == 0
    with pytest.raises(ValueError):
        PrefixCache(0)


def test_a_block_published_twice_stays_with_its_first_publisher() -> None:
    pool = PrefixCache(4)
    one = pool.acquire(("k",), 0, 1)
    two = pool.acquire(("k",), 0, 1)  # computed at the same time: no hit for either
    pool.publish(one, ("k",))
    pool.publish(two, ("k",))
    assert (len(one.named), len(two.named), two.anonymous) == (1, 0, 1)
    pool.release(two)
    assert pool.free_blocks == 3  # the duplicate is simply freed
    pool.release(one)
    assert pool.cached_blocks == 1


# ---------------------------------------------------------------------- properties

KEYS = st.lists(st.sampled_from("abc"), min_size=0, max_size=4).map(lambda p: chain(*p))


class PoolMachine(RuleBasedStateMachine):
    """Random acquire/grow/publish/release; every rule of the pool checked after each."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = PrefixCache(6)
        self.tables: list[tuple[BlockTable, tuple[str, ...]]] = []

    @rule(keys=KEYS, extra=st.integers(0, 3))
    def acquire(self, keys: tuple[str, ...], extra: int) -> None:
        matched = self.pool.match(keys)
        if self.pool.needed(keys, matched) + extra > self.pool.available_blocks:
            with pytest.raises(ValueError):
                self.pool.acquire(keys, matched, extra)
            return
        table = self.pool.acquire(keys, matched, extra)
        assert len(table.named) == matched <= len(keys)
        self.tables.append((table, keys))

    @precondition(lambda self: self.tables)
    @rule(index=st.integers(0, 100))
    def publish(self, index: int) -> None:
        table, keys = self.tables[index % len(self.tables)]
        self.pool.publish(table, keys)

    @precondition(lambda self: self.tables)
    @rule(index=st.integers(0, 100))
    def grow(self, index: int) -> None:
        table, _ = self.tables[index % len(self.tables)]
        if self.pool.available_blocks:
            self.pool.grow(table)

    @precondition(lambda self: self.tables)
    @rule(index=st.integers(0, 100))
    def release(self, index: int) -> None:
        table, _ = self.tables.pop(index % len(self.tables))
        self.pool.release(table)
        assert table.blocks == 0

    @invariant()
    def blocks_add_up_and_held_blocks_stay(self) -> None:
        pool = self.pool
        held = {id(block): block for table, _ in self.tables for block in table.named}
        anonymous = sum(table.anonymous for table, _ in self.tables)
        # Never more than the pool: free + cached + held named + held anonymous.
        assert pool.free_blocks + pool.cached_blocks + len(held) + anonymous == pool.total_blocks
        assert pool.used_blocks == len(held) + anonymous
        for block in held.values():
            expected = sum(b is block for table, _ in self.tables for b in table.named)
            assert block.refs == expected > 0  # counted exactly, never negative
            assert pool._named[block.key] is block  # a block in use is never evicted
            assert block.key not in pool._lru
        for block in pool._lru.values():
            assert block.refs == 0


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
