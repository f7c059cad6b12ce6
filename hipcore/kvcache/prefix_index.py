"""PrefixIndex: which full KV blocks of one layer group's pool hold known contents, and the LRU of the cached ones
(the prefix cache, docs/architecture.md "Prefix caching").

A full block's identity is its key: block_hash((parent key, its token ids)), where the parent key of a sequence's
first block is the group's salt, a hash of what else makes the contents differ (model identity, KV dtype, block
size, layer group and its window). A key therefore names a whole prefix, not one block's tokens. The index keeps,
per hashed block, its entry (key, parent key, token ids); a lookup by key is confirmed against the stored parent key
and token ids, so two prefixes whose keys collide never share a block (the second simply is not cached).

A hashed block is referenced (some tables hold it), pending (released, waiting for the step fence) or cached
(reference count 0, its contents valid, on the LRU: taken again by a sequence whose prompt starts with its prefix, or
evicted, least recently used first, when the pool needs a free block). A free block never has an entry.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple, Sequence

BlockHash = Callable[[object], int]


class BlockEntry(NamedTuple):
    key: int
    parent: int  # the key of the block before it in its sequence (the group's salt for the first block)
    tokens: tuple[int, ...]  # the block's token ids: what a key hit is confirmed against


def chain_entries(salt: int, tokens, block_size: int, count: int, block_hash: BlockHash = hash) -> list[BlockEntry]:
    """The entries of the first `count` full blocks of `tokens`, each keyed on the one before it."""
    entries: list[BlockEntry] = []
    parent = salt
    for i in range(count):
        chunk = tuple(tokens[i * block_size:(i + 1) * block_size])
        key = block_hash((parent, chunk))
        entries.append(BlockEntry(key, parent, chunk))
        parent = key
    return entries


class BlockKeys:
    """The entries of one token list's full blocks, per group salt, each computed once: kept on a sequence
    (hipcore/engine/request.py) for every lookup and hashing of its tokens, from its first wait in the queue to its
    release. Valid while `tokens` only grows (a sequence appends its sampled tokens): a full block's entry depends on
    its tokens and those before it only. A caller that changes a token already in a full block makes new BlockKeys."""

    __slots__ = ("tokens", "_chains")

    def __init__(self, tokens: Sequence[int]):
        self.tokens = tokens
        self._chains: dict[int, list[BlockEntry]] = {}  # salt -> entries of the first full blocks, in order

    def entries(self, salt: int, block_size: int, count: int, block_hash: BlockHash) -> list[BlockEntry]:
        """chain_entries(salt, self.tokens, block_size, count, block_hash), hashing only blocks not hashed before."""
        chain = self._chains.get(salt)
        if chain is None:
            chain = self._chains[salt] = []
        if len(chain) < count:
            if count * block_size > len(self.tokens):
                raise ValueError(f"{count} full blocks of {block_size} asked of {len(self.tokens)} tokens")
            start = len(chain)
            chain += chain_entries(chain[-1].key if chain else salt, self.tokens[start * block_size:count * block_size],
                                   block_size, count - start, block_hash)
        return chain if len(chain) == count else chain[:count]

    def fork(self, tokens: Sequence[int]) -> "BlockKeys":
        """The keys of `tokens`, a copy of this list's tokens (a parallel sample's): the entries so far, shared."""
        twin = BlockKeys(tokens)
        twin._chains = {salt: list(chain) for salt, chain in self._chains.items()}
        return twin


class PrefixIndex:
    """Key -> block and block -> entry of one pool's hashed blocks, and the LRU of its cached blocks (oldest first).
    The pool (block_pool.py) decides the states; this only keeps the maps consistent."""

    def __init__(self, block_hash: BlockHash = hash):
        self.block_hash = block_hash
        self.block_of: dict[int, int] = {}  # key -> block
        self.entry_of: dict[int, BlockEntry] = {}  # block -> its entry
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, least recently used first

    def find(self, entry: BlockEntry) -> int | None:
        """The block holding `entry`'s contents, confirmed against its stored parent key and token ids."""
        block = self.block_of.get(entry.key)
        if block is None:
            return None
        stored = self.entry_of[block]
        return block if stored.parent == entry.parent and stored.tokens == entry.tokens else None

    def add(self, block: int, entry: BlockEntry) -> bool:
        """Hash `block` as `entry`; False (nothing changed) when another block already holds that key."""
        if entry.key in self.block_of:
            return False
        self.block_of[entry.key] = block
        self.entry_of[block] = entry
        return True

    def forget(self, block: int) -> None:
        entry = self.entry_of.pop(block)
        del self.block_of[entry.key]
        self.lru.pop(block, None)
