"""SGLang HiCache storage backend over UCM's BlockStore.

Loaded by SGLang's ``--hicache-storage-backend dynamic`` with
``--hicache-storage-backend-extra-config`` set to::

    {"backend_name": "ucm", "module_path": "ucm.sglang_hicache",
     "class_name": "UcmHiCacheStorage", "ucm_dir": "/path/to/store"}

Optional keys: ``ucm_identity`` (a dict of names to strings added to the
deployment's identity), ``ucm_pool_bytes`` (memory tier per component store,
default 256 MiB), ``ucm_disk_blocks`` (pages on disk before GC per host
pool, default 2^20; the pools' disk tiers collect as one, by bytes, so K/V
pages and Mamba states get the room their use asks for), ``ucm_workers``,
``ucm_durable_wait`` (a set returns once its pages are on disk, where every
other instance sees them, not only in this instance's memory tier; default
true: HiCache writes on its own backup thread, never on the forward path),
``ucm_sync_mode`` (how the disk tier makes writes durable: ``auto``, one
``syncfs`` per batch where the file system allows, or ``files``, an fsync
per file and directory, for a store on a busy shared file system).

Zero copy: pages move between SGLang's host pools and the store through
the pools' ``get_page_buffer_meta`` addresses. A page is one block; each of
its buffers (K and V of each layer, a whole page, a Mamba temporal or conv
state) is one shard. Buffers of different sizes go to different stores
(one per size, under ``<ucm_dir>/<pool>/<size>``), since a store has one
shard size; every size must be a multiple of 4 KiB. A page exists only when
every one of its buffers is stored.

Implemented: ``batch_get_v1``/``batch_set_v1`` (per-page booleans),
``batch_exists`` (leading pages present), the hybrid ``batch_exists_v2``
(per-pool hit policies ``all_pages``, ``trailing_pages``, ``block_groups``)
and ``batch_get_v2``/``batch_set_v2`` for pools registered with
``register_mem_host_pool_v2`` (Mamba, SWA, ...), and the older
``get``/``set``/``batch_get``/``batch_set``/``exists`` over host tensors.
Failures are reported the way HiCache expects: a ``False`` for each page
that was not read or written, never a silent ``True``.

Keys are SGLang's page hashes; the block id is MD5 of the key with the
model name, and the TP rank unless the model is MLA (whose ranks hold the
same bytes), the pipeline stage and the DCP rank, and the deployment's
identity (``ucm.identity.key_identity``: the model's revision and a
fingerprint of its config and weight-index files, from its path; the KV
host pool's layout and dtype; and ``ucm_identity``, a dict of the user's
own keys), so instances of one deployment share pages and other
deployments, a checkpoint written over another under the same name
included, never collide.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from ucm._components import ComponentStores, DiskBudget
from ucm.identity import key_identity, pool_layout

logger = logging.getLogger(__name__)

KV = str(PoolName.KV)


def _flat(xs: Sequence[Any]) -> List[int]:
    out: List[int] = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(int(v) for v in x)
        else:
            out.append(int(x))
    return out


class _PoolStores:
    """The stores of one host pool: a page is a block, each of its buffers
    a component (``ucm._components``)."""

    def __init__(self, name: str, pool: Any, root: str, opts: Dict[str, Any], budget: DiskBudget) -> None:
        self.name = name
        self.pool = pool
        self.page_size = int(getattr(pool, "page_size", 1) or 1)
        probe = torch.arange(self.page_size, dtype=torch.int64)
        ptrs, sizes = pool.get_page_buffer_meta(probe)
        sizes = _flat(sizes)
        if not sizes or len(_flat(ptrs)) != len(sizes):
            raise ValueError(f"HiCache pool `{name}`: no page buffers to store")
        try:
            self.stores = ComponentStores(
                os.path.join(root, name),
                sizes,
                pool_bytes=int(opts.get("ucm_pool_bytes", 256 << 20)),
                disk_blocks=int(opts.get("ucm_disk_blocks", 1 << 20)),
                workers=int(opts.get("ucm_workers", 2)),
                sync_mode=str(opts.get("ucm_sync_mode", "auto")),
                disk_budget=budget,
            )
        except ValueError as e:
            raise ValueError(
                f"HiCache pool `{name}`: {e}; choose a page size that gives page buffers "
                "of whole 4 KiB"
            ) from None

    @property
    def sizes(self) -> List[int]:
        """Bytes of each buffer of a page."""
        return self.stores.sizes

    def transfer(self, ids: List[bytes], host_indices: Any, is_set: bool, durable: bool) -> List[bool]:
        """Moves every buffer of each page; ``True`` per page that moved whole."""
        n = len(ids)
        if n == 0:
            return []
        if host_indices is None or len(host_indices) != n * self.page_size:
            got = None if host_indices is None else len(host_indices)
            raise ValueError(
                f"HiCache pool `{self.name}`: {n} keys need {n * self.page_size} host "
                f"indices, got {got}"
            )
        ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
        ptrs, sizes = _flat(ptrs), _flat(sizes)
        per = len(self.sizes)
        if len(ptrs) != n * per or sizes[:per] != self.sizes:
            raise ValueError(
                f"HiCache pool `{self.name}`: {len(ptrs)} buffers for {n} pages; the pool's "
                f"layout changed since it was registered"
            )
        items = [(bid, j, ptrs[p * per + j]) for p, bid in enumerate(ids) for j in range(per)]
        try:
            h = self.stores.start("dump" if is_set else "load", items)
        except Exception:  # a refused task: nothing of it moved
            logger.exception("ucm hicache: %s of %d pages refused", "set" if is_set else "get", n)
            return [False] * n
        index = {bid: p for p, bid in enumerate(ids)}
        ok = [True] * n
        for bid, _comp, kind, detail in self.stores.finish(h, durable=durable):
            if bid in index:
                ok[index[bid]] = False
            if kind != "miss":
                logger.warning("ucm hicache: page %s of pool %s: %s (%s)", bid.hex(), self.name, kind, detail)
        return ok


class UcmHiCacheStorage(HiCacheStorage):
    """UCM as SGLang HiCache's L3 storage."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None) -> None:
        extra = dict(storage_config.extra_config or {})
        root = extra.get("ucm_dir") or os.environ.get("UCM_HICACHE_DIR")
        if not root:
            raise ValueError(
                "UCM HiCache backend: set `ucm_dir` in --hicache-storage-backend-extra-config "
                "(or UCM_HICACHE_DIR) to the store directory"
            )
        self.storage_config = storage_config
        self._root = str(root)
        self._opts = extra
        self._durable = bool(extra.get("ucm_durable_wait", True))
        c = storage_config
        rank = "mla" if c.is_mla_model else f"tp{c.tp_rank}of{c.tp_size}"
        self._base_tag = f"{c.model_name or ''}|{rank}|pp{c.pp_rank}of{c.pp_size}|dcp{c.dcp_rank}of{c.dcp_size}|"
        self._user_identity = extra.get("ucm_identity")
        self._tag = self._base_tag + key_identity(c.model_name, self._user_identity, None) + "|"
        self._pools: Dict[str, _PoolStores] = {}
        # One disk byte budget for every host pool's stores.
        self._disk_budget = DiskBudget()
        pool = (kwargs or {}).get("mem_pool_host") if isinstance(kwargs, dict) else None
        if pool is not None:
            self.register_mem_pool_host(pool)

    # -- registration -------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The KV host pool (the anchor)."""
        super().register_mem_pool_host(mem_pool_host)
        self._pools[KV] = _PoolStores(KV, mem_pool_host, self._root, self._opts, self._disk_budget)
        # The KV pool's layout and dtype are part of the identity.
        self._tag = (
            self._base_tag
            + key_identity(self.storage_config.model_name, self._user_identity, pool_layout(mem_pool_host))
            + "|"
        )

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A further host pool (Mamba, SWA, indexer, ...) for the v2 calls."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name == KV and KV in self._pools:
            return
        self._pools[name] = _PoolStores(name, host_pool, self._root, self._opts, self._disk_budget)

    def _pool(self, name: Any) -> _PoolStores:
        p = self._pools.get(str(name))
        if p is None:
            raise ValueError(f"UCM HiCache backend: pool `{name}` was never registered")
        return p

    def _ids(self, keys: Sequence[str]) -> List[bytes]:
        return [hashlib.md5((self._tag + str(k)).encode()).digest() for k in keys]

    # -- v1: the KV pool ----------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """The number of leading pages stored."""
        return self._pool(KV).stores.leading(self._ids(keys))

    def exists(self, key: str) -> bool:
        return self._pool(KV).stores.exists(self._ids([key]))[0]

    def batch_get_v1(
        self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> List[bool]:
        """Reads pages into the host pool at ``host_indices``."""
        return self._pool(KV).transfer(self._ids(keys), host_indices, False, self._durable)

    def batch_set_v1(
        self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> List[bool]:
        """Writes the host pool's pages at ``host_indices``."""
        return self._pool(KV).transfer(self._ids(keys), host_indices, True, self._durable)

    # -- v2: hybrid pools ---------------------------------------------------

    def batch_exists_v2(
        self,
        keys: List[str],
        pool_transfers: Optional[List[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
        """The usable prefix: KV pages from the start, each further pool
        removing the stop points its hit policy cannot serve."""
        ids = self._ids(keys)
        kv_pages = self._pool(KV).stores.leading(ids)
        hits: Dict[str, int] = {KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable and t.hit_policy != PoolHitPolicy.BLOCK_GROUPS:
                break
            present = self._pool(t.name).stores.exists(ids[:kv_pages])
            mine: List[int] = []
            boundary = 0
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = present.index(False) if False in present else kv_pages
                mine = list(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                for end in range(kv_pages, 0, -1):
                    if all(present[max(0, end - trailing) : end]):
                        mine.append(end)
                        boundary = boundary or end
            elif t.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
                group = int(t.group_pages)
                if group <= 0:
                    raise ValueError(f"pool `{t.name}`: block_groups needs group_pages > 0")
                whole = 0
                while whole + group <= kv_pages and all(present[whole : whole + group]):
                    whole += group
                if whole:
                    hits[str(t.name)] = whole
                continue  # its own verdict; it never gates the KV hit
            else:
                raise ValueError(f"pool `{t.name}`: unsupported hit policy {t.hit_policy}")
            if boundary:
                hits[str(t.name)] = boundary
            keep = set(mine)
            restorable = [p for p in restorable if p in keep]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    def _batch_v2(self, transfers: List[PoolTransfer], is_set: bool) -> Dict[str, List[bool]]:
        out: Dict[str, List[bool]] = {}
        for t in transfers:
            keys = list(t.keys or [])
            out[t.name] = self._pool(t.name).transfer(self._ids(keys), t.host_indices, is_set, self._durable)
        return out

    def batch_get_v2(
        self, transfers: List[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> Dict[str, List[bool]]:
        """Reads each transfer's pages into its pool; per pool, per page."""
        return self._batch_v2(transfers, False)

    def batch_set_v2(
        self, transfers: List[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> Dict[str, List[bool]]:
        """Writes each transfer's pages from its pool; per pool, per page."""
        return self._batch_v2(transfers, True)

    # -- the older interface, over host tensors -----------------------------

    def _page_addrs(self, t: torch.Tensor) -> List[int]:
        p = self._pool(KV)
        need = sum(p.sizes)
        if t.device.type != "cpu" or not t.is_contiguous() or t.numel() * t.element_size() != need:
            raise ValueError(f"a page value is a contiguous host tensor of {need} bytes")
        base, addrs = t.data_ptr(), []
        for s in p.sizes:
            addrs.append(base)
            base += s
        return addrs

    def _move_one(self, key: str, t: torch.Tensor, is_set: bool) -> bool:
        p = self._pool(KV)
        bid = self._ids([key])[0]
        items = [(bid, j, a) for j, a in enumerate(self._page_addrs(t))]
        h = p.stores.start("dump" if is_set else "load", items)
        return not p.stores.finish(h, durable=self._durable)

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """The page of ``key`` (into ``target_location`` when given), or None."""
        if not self.exists(key):
            return None
        t = target_location
        if t is None:
            t = torch.empty(sum(self._pool(KV).sizes), dtype=torch.uint8)
        return t if self._move_one(key, t, False) else None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        locs = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(
        self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> bool:
        """Stores the page ``value`` (or ``target_location``) under ``key``."""
        t = value if value is not None else target_location
        if t is None:
            raise ValueError("set needs a value")
        return self._move_one(key, t, True)

    def batch_set(
        self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> bool:
        vals = values if values is not None else target_locations
        if vals is None or len(vals) != len(keys):
            raise ValueError("batch_set needs one value per key")
        return all([self.set(k, v) for k, v in zip(keys, vals)])

    def ucm_counters(self) -> Dict[str, List[dict]]:
        """UCM's store counters per pool and buffer size (SGLang's own
        ``get_stats`` keeps its default: it expects its StorageMetrics)."""
        return {name: p.stores.counters() for name, p in self._pools.items()}


__all__ = ["UcmHiCacheStorage"]
