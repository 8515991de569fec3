"""Paged KV blocks that requests with a common prefix share: the block pool of a prefix cache.

A request names its prompt's full blocks by a chain of hashes (equal hashes at position
*i* mean equal prompts up to the end of block *i*, as in vLLM's automatic prefix caching
and the Mooncake traces' ``hash_ids``). The pool holds ``total_blocks`` blocks, each in
one of three conditions:

- **free**: holds nothing;
- **in use**: held by one or more requests (its reference count); a block in use is
  never evicted;
- **cached**: held by nobody, but still holding the KV of a named prefix block. It waits
  in a least-recently-released list and is reused by a request whose prompt starts with
  the same chain, or evicted (oldest first) when an allocation finds no free block.

Every operation costs time in the number of blocks it touches, never in the pool's size.
Nothing here knows about time, requests or engines: :class:`BlockTable` is what one
holder owns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from simsim.clock import check_count
from simsim.wording import counted

__all__ = ["BlockTable", "PrefixCache"]


class _Block:
    """A named block: the prefix hash it holds and how many holders share it."""

    __slots__ = ("key", "refs")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.refs = 0


class BlockTable:
    """The blocks one holder owns: named (shared or shareable) blocks first, then
    anonymous ones (holding tokens past the last full named block)."""

    __slots__ = ("anonymous", "named")

    def __init__(self) -> None:
        self.named: list[_Block] = []
        self.anonymous = 0

    @property
    def blocks(self) -> int:
        """How many blocks the holder owns."""
        return len(self.named) + self.anonymous


class PrefixCache:
    """A pool of *total_blocks* KV blocks with prefix sharing and LRU eviction."""

    __slots__ = ("_free", "_lru", "_named", "_total")

    def __init__(self, total_blocks: int) -> None:
        self._total = check_count(total_blocks, "total_blocks", minimum=1)
        self._free = self._total
        self._named: dict[Hashable, _Block] = {}
        # Named blocks nobody holds, oldest release first: evicted from the front.
        self._lru: OrderedDict[Hashable, _Block] = OrderedDict()

    # ------------------------------------------------------------------ reading

    @property
    def total_blocks(self) -> int:
        """The pool's size."""
        return self._total

    @property
    def free_blocks(self) -> int:
        """Blocks holding nothing."""
        return self._free

    @property
    def cached_blocks(self) -> int:
        """Blocks nobody holds that still hold a named prefix block (evictable)."""
        return len(self._lru)

    @property
    def available_blocks(self) -> int:
        """Blocks an allocation may take: free ones, then cached ones by eviction."""
        return self._free + len(self._lru)

    @property
    def used_blocks(self) -> int:
        """Blocks held by at least one holder."""
        return self._total - self._free - len(self._lru)

    def match(self, keys: Sequence[Hashable], limit: int | None = None) -> int:
        """How many of *keys*, from the first, name blocks the pool holds (in use or
        cached), at most *limit*. Reads only: nothing is reserved."""
        named = self._named
        count = 0
        stop = len(keys) if limit is None else min(limit, len(keys))
        while count < stop and keys[count] in named:
            count += 1
        return count

    def frozen_match(self) -> Callable[[Sequence[Hashable]], int]:
        """:meth:`match` (without a limit) as the pool is now: later work on the pool
        does not change its answers."""
        named = frozenset(self._named)

        def match(keys: Sequence[Hashable]) -> int:
            count = 0
            for key in keys:
                if key not in named:
                    break
                count += 1
            return count

        return match

    def needed(self, keys: Sequence[Hashable], matched: int) -> int:
        """Blocks an :meth:`acquire` of the first *matched* of *keys* takes from what is
        available: the matched blocks that are cached (not in use), which stop being
        evictable."""
        lru = self._lru
        return sum(1 for key in keys[:matched] if key in lru)

    # ------------------------------------------------------------------ changing

    def acquire(self, keys: Sequence[Hashable], matched: int, extra_blocks: int) -> BlockTable:
        """Hold the first *matched* named blocks of *keys* and *extra_blocks* new ones.

        The caller has checked with :meth:`match` that the first *matched* keys are held
        by the pool, and that ``needed(keys, matched) + extra_blocks`` blocks are
        available; ``ValueError`` otherwise, with nothing changed. New blocks come from
        the free ones first, then by evicting cached blocks, oldest release first.
        """
        extra_blocks = check_count(extra_blocks, "extra_blocks")
        if self.match(keys, matched) != matched:
            raise ValueError(
                f"only {self.match(keys, matched)} of the {counted(matched, 'block')} "
                f"{'is' if matched == 1 else 'are'} held"
            )
        if self.needed(keys, matched) + extra_blocks > self.available_blocks:
            raise ValueError(
                f"{matched} shared and {counted(extra_blocks, 'new block')} do not fit: "
                f"{self.available_blocks} available"
            )
        table = BlockTable()
        for key in keys[:matched]:
            block = self._named[key]
            if block.refs == 0:
                del self._lru[key]
            block.refs += 1
            table.named.append(block)
        self._take(extra_blocks)
        table.anonymous = extra_blocks
        return table

    def grow(self, table: BlockTable, blocks: int = 1) -> None:
        """Give *table* *blocks* more anonymous blocks (``ValueError`` if unavailable)."""
        blocks = check_count(blocks, "blocks")
        if blocks > self.available_blocks:
            raise ValueError(
                f"{counted(blocks, 'new block')} {'does' if blocks == 1 else 'do'} not fit: "
                f"{self.available_blocks} available"
            )
        self._take(blocks)
        table.anonymous += blocks

    def publish(self, table: BlockTable, keys: Sequence[Hashable]) -> None:
        """Name *table*'s anonymous blocks that now hold full prefix blocks.

        *keys* are the chain of the holder's full blocks so far; those past the table's
        named blocks are given to its anonymous blocks, in order, while it has some. A
        key another holder published first stays with that block: this holder's copy
        stays anonymous (two holders computed the same block at once).
        """
        named = self._named
        index = len(table.named)
        while index < len(keys) and table.anonymous > 0:
            key = keys[index]
            if key in named:
                break  # the chain continues in another holder's block: stop naming
            block = _Block(key)
            block.refs = 1
            named[key] = block
            table.named.append(block)
            table.anonymous -= 1
            index += 1

    def release(self, table: BlockTable) -> None:
        """Give back every block of *table*: named ones become cached when their last
        holder leaves (newest release last in the eviction order, the prefix's deepest
        block first so that it is evicted before the blocks it extends); anonymous ones
        become free."""
        for block in reversed(table.named):
            block.refs -= 1
            if block.refs == 0:
                self._lru[block.key] = block
        self._free += table.anonymous
        table.named = []
        table.anonymous = 0

    def _take(self, blocks: int) -> None:
        from_free = min(blocks, self._free)
        self._free -= from_free
        for _ in range(blocks - from_free):
            key, _block = self._lru.popitem(last=False)
            del self._named[key]
