"""KvGroupView: one layer group's pools as the kernels of that group's layers see them.

The forward pass hands each layer the cache of its group (hipcore/model/forward.py): a layer's blocks
read `cache.config.num_blocks` (the size of the pool its K and V live in) and `cache.k_pools[i]`; for a
sliding-window layer those must be the local group's. The view answers exactly that and nothing else:
its config is the cache's with num_blocks set to the group's pool (layer_windows kept, so a family can
still read `config.layer_window(i)`), and its pools are the cache's, with None for the other group's
layers so that a layer handed the wrong group fails at once instead of reading a pool of another size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hipcore.kvcache.config import KvCacheConfig
from hipcore.runtime.device import Buffer


@dataclass(frozen=True)
class KvGroupView:
    group: str
    config: KvCacheConfig
    k_pools: tuple[Buffer | None, ...]
    v_pools: tuple[Buffer | None, ...]


def group_view(config: KvCacheConfig, k_pools: tuple[Buffer, ...], v_pools: tuple[Buffer, ...], group: str) -> KvGroupView:
    blocks = config.group_blocks(group)  # refuses a group the cache does not have
    mine = [config.layer_group(i) == group for i in range(config.n_layers)]
    return KvGroupView(
        group, dataclasses.replace(config, num_blocks=blocks),
        tuple(p if m else None for p, m in zip(k_pools, mine)), tuple(p if m else None for p, m in zip(v_pools, mine)))
