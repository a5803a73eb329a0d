"""The KV memory of a simulated engine: GPU blocks with a prefix cache, and a host tier.

KV is counted in blocks. With prefix caching a finished or preempted call's
blocks stay cached for its context (LRU across contexts; a program has one, plus
one per subagent whose calls say so), so the context's next call on this engine
prefills only what is new; on another engine it starts cold.

With a host-memory tier (``EnginePreset.kv_offload_gib``), modelled on vLLM's
CPU offloading connector: every block a call computes is also stored in host
memory (write-through, an LRU of contexts), and a call whose prefix left the GPU
but not the host loads it back over PCIe instead of recomputing it.
"""

from __future__ import annotations

from collections import OrderedDict

from .jobs import Job


def ceil_blocks(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` (a partly filled last block counts)."""
    return -(-tokens // block_size)


def _prefix_blocks(cached: int, job: Job, block_size: int) -> int:
    """Full blocks of ``job``'s prompt a cache of ``cached`` tokens of its context holds
    (at least one token is always computed, as in vLLM)."""
    return max(0, min(cached, job.missing - 1)) // block_size


class KVPool:
    """Blocks in use by running calls plus a per-context LRU prefix cache.

    A context's cache entry is the longest run of it that was computed here;
    entries whose blocks a running call shares (a prefix hit) are pinned.
    """

    def __init__(self, capacity: int, block_size: int, prefix_caching: bool) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.used = 0
        self.cached_blocks = 0
        self.pinned_blocks = 0
        self.cache: OrderedDict[str, int] = OrderedDict()  # context -> cached tokens
        self.pins: dict[str, int] = {}
        self._largest_pinned: int | None = 0  # None: pins or their sizes changed since
        self.hit_tokens = 0
        self.prompt_tokens = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used - self.cached_blocks

    @property
    def reclaimable(self) -> int:
        """Blocks that are free or can be freed by evicting unpinned cache entries."""
        return self.capacity - self.used - self.pinned_blocks

    def reclaim(self, need: int) -> bool:
        """Evict least recently used, unpinned entries until ``need`` blocks are free."""
        freed = self.free
        if freed >= need:
            return True
        if self.reclaimable < need:
            return False
        victims = []
        for pid, tokens in self.cache.items():
            if pid not in self.pins:
                victims.append(pid)
                freed += ceil_blocks(tokens, self.block_size)
                if freed >= need:
                    break
        for pid in victims:
            self.cached_blocks -= ceil_blocks(self.cache.pop(pid), self.block_size)
        return True

    def hit(self, job: Job) -> int:
        """Full blocks of ``job``'s prompt its context has cached here (at least one token
        is always computed, as in vLLM)."""
        if not self.prefix_caching:
            return 0
        return _prefix_blocks(self.cache.get(job.context, 0), job, self.block_size)

    def admit(self, job: Job, hit_blocks: int) -> None:
        job.hit_blocks = hit_blocks
        job.computed = hit_blocks * self.block_size
        if hit_blocks:
            self.cache.move_to_end(job.context)
            self.pin(job.context)

    def pin(self, context: str) -> None:
        """Keep ``context``'s cached blocks from eviction (a call shares them, or the
        residency holds them) until as many :meth:`unpin` calls."""
        if context not in self.pins:
            self.pins[context] = 0
            self.pinned_blocks += ceil_blocks(self.cache[context], self.block_size)
            self._largest_pinned = None
        self.pins[context] += 1

    def unpin(self, context: str) -> None:
        self.pins[context] -= 1
        if not self.pins[context]:
            del self.pins[context]
            self.pinned_blocks -= ceil_blocks(self.cache[context], self.block_size)
            self._largest_pinned = None

    def largest_pinned(self) -> int:
        """Blocks of the largest pinned context; counted again only after the pins
        change, since admission asks for every waiter it looks at."""
        if self._largest_pinned is None:
            self._largest_pinned = max((self.context_blocks(c) for c in self.pins), default=0)
        return self._largest_pinned

    def context_blocks(self, context: str) -> int:
        """Blocks cached for ``context`` (0 if none)."""
        return ceil_blocks(self.cache.get(context, 0), self.block_size)

    def grow(self, job: Job, tokens: int) -> bool:
        """Make room for ``tokens`` more of ``job``'s KV; False if the pool is full."""
        held = job.hit_blocks + job.own_blocks
        if job.computed + tokens <= held * self.block_size:
            return True  # fits in its last block
        need = ceil_blocks(job.computed + tokens, self.block_size) - held
        if need <= 0:
            return True
        if not self.reclaim(need):
            return False
        job.own_blocks += need
        self.used += need
        return True

    def release(self, job: Job) -> None:
        """The job left the batch; with prefix caching its KV stays cached."""
        pid = job.context
        bs = self.block_size
        self.used -= job.own_blocks
        job.own_blocks = 0
        if job.hit_blocks:
            job.hit_blocks = 0
            self.unpin(pid)
        if self.prefix_caching and job.computed:
            old = self.cache.get(pid, 0)
            new = max(old, job.computed)
            grown = ceil_blocks(new, bs) - ceil_blocks(old, bs)
            self.cached_blocks += grown
            if pid in self.pins:
                self.pinned_blocks += grown
                self._largest_pinned = None
            self.cache[pid] = new
            self.cache.move_to_end(pid)
            self.reclaim(0)
        job.computed = 0


class HostTier:
    """Host-memory copies of KV, as vLLM's CPU offloading keeps them.

    Writes go through: every full block a call computes is also stored here, so
    the entry of a context is the longest run of it any call computed (only full
    blocks). Entries are evicted least recently used when the tier is full.
    Loads back to the GPU go over one link, one transfer after another.
    """

    def __init__(self, capacity: int, block_size: int, seconds_per_token: float) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.seconds_per_token = seconds_per_token
        self.cache: OrderedDict[str, int] = OrderedDict()  # context -> stored tokens
        self.blocks = 0
        self.link_free_at = 0.0
        self.reloaded_tokens = 0

    def hit(self, job: Job) -> int:
        """Full blocks of ``job``'s prompt stored here."""
        return _prefix_blocks(self.cache.get(job.context, 0), job, self.block_size)

    def store(self, context: str, tokens: int) -> int:
        """Keep the full blocks of ``tokens`` of ``context``; returns the tokens now
        stored for it (0 if it cannot fit even in an empty tier)."""
        old = self.cache.pop(context, 0)
        self.blocks -= old // self.block_size
        stored = max(old, tokens // self.block_size * self.block_size)
        need = stored // self.block_size
        if need > self.capacity:
            return 0
        while self.blocks + need > self.capacity:
            self.blocks -= self.cache.popitem(last=False)[1] // self.block_size
        self.cache[context] = stored
        self.blocks += need
        return stored

    def load(self, context: str, tokens: int, now: float) -> float:
        """Move ``tokens`` of ``context``'s KV to the GPU after the transfers before it;
        returns when it is done."""
        self.cache.move_to_end(context)
        self.link_free_at = max(now, self.link_free_at) + tokens * self.seconds_per_token
        self.reloaded_tokens += tokens
        return self.link_free_at
