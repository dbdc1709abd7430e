"""Blocks made of components of several sizes, over UCM's BlockStore.

A BlockStore has one shard size, but a block of the engines' other plug-in
points can hold buffers of several sizes (K and V of different widths, a
Mamba temporal state beside conv states). Here each size gets its own
BlockStore under ``<root>/<size>``, and component ``c`` of a block is shard
``k`` of its size's store, ``k`` counting the components of that size
before it. A block is present only when every store holds it.

The stores' disk tiers collect as one (a ``DiskBudget`` of the bytes of
``disk_blocks`` blocks), together with any other stores given the same
budget (the other host pools of one SGLang engine), and a block's
components go together: GC never keeps a component of a block that lost
another.

The component sizes are recorded in ``<root>/LAYOUT`` (written once,
atomically; another layout over the same root is refused), so a process
that does not know them (upstream UCM's scheduler side) can still look
blocks up: until a worker wrote the layout, every lookup is a miss.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from ucm._ucm import BlockStore, DiskBudget

LAYOUT = "LAYOUT"


def _read_layout(root: str) -> Optional[List[int]]:
    path = os.path.join(root, LAYOUT)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except FileNotFoundError:
        return None
    try:
        sizes = json.loads(raw)["component_bytes"]
        if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
            raise ValueError
        return sizes
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}: not a UCM component layout ({raw[:64]!r})") from None


def _write_layout(root: str, sizes: List[int]) -> None:
    os.makedirs(root, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".layout-", dir=root)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"component_bytes": sizes}, f)
            f.flush()
            os.fsync(f.fileno())
        # link, not rename: the first writer wins, a racing one compares.
        try:
            os.link(tmp, os.path.join(root, LAYOUT))
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


class Handle:
    """A transfer in flight over one or more stores."""

    def __init__(self, kind: str, parts: List[Tuple[BlockStore, int, Dict[Tuple[bytes, int], int]]]):
        self.kind = kind
        # Per store: the store, its task, and (block id, shard) -> component.
        self.parts = parts


class ComponentStores:
    """The stores of one block layout under ``root``. ``disk_budget``: a
    ``DiskBudget`` shared with other stores (default: one of their own)."""

    def __init__(
        self,
        root: str,
        sizes: Optional[Sequence[int]],
        *,
        pool_bytes: int = 256 << 20,
        disk_blocks: int = 1 << 20,
        workers: int = 2,
        device: str = "cpu",
        sync_mode: str = "auto",
        disk_budget: Optional[DiskBudget] = None,
    ) -> None:
        self.root = root
        self._opts = dict(
            pool_bytes=pool_bytes,
            disk_blocks=disk_blocks,
            workers=workers,
            device=device,
            sync_mode=sync_mode,
        )
        # One budget for the stores (shared with others when given), and a
        # link: a block's components are taken or kept together.
        self._budget = disk_budget if disk_budget is not None else DiskBudget()
        self._link = self._budget.new_link()
        self.sizes: Optional[List[int]] = None
        self._stores: List[BlockStore] = []
        self._where: List[Tuple[int, int]] = []
        if sizes is not None:
            sizes = [int(s) for s in sizes]
            for s in sizes:
                if s <= 0 or s % 4096:
                    raise ValueError(
                        f"a block component of {s} bytes: UCM stores components of "
                        "whole 4 KiB pages (O_DIRECT)"
                    )
            have = _read_layout(root)
            if have is None:
                _write_layout(root, sizes)
                have = _read_layout(root)
            if have != sizes:
                raise ValueError(
                    f"{root} holds blocks of components {have} bytes; this store's are "
                    f"{sizes} (another model or layout: use another directory)"
                )
            self._open(sizes)

    def _open(self, sizes: List[int]) -> None:
        by_size: Dict[int, int] = {}
        counts: List[int] = []
        where = []
        for s in sizes:
            k = by_size.setdefault(s, len(counts))
            if k == len(counts):
                counts.append(0)
            where.append((k, counts[k]))
            counts[k] += 1
        order = sorted(by_size.items(), key=lambda kv: kv[1])
        self._stores = [
            BlockStore(
                os.path.join(self.root, str(size)),
                size,
                counts[k],
                disk_budget=self._budget,
                budget_link=self._link,
                **self._opts,
            )
            for size, k in order
        ]
        self._where = where
        self.sizes = sizes

    def _ready(self) -> bool:
        if self.sizes is None:
            sizes = _read_layout(self.root)
            if sizes is None:
                return False
            self._open(sizes)
        return True

    @property
    def components(self) -> int:
        """Components per block (0 while the layout is unknown)."""
        return len(self.sizes or [])

    def exists(self, ids: List[bytes]) -> List[bool]:
        """Presence of each block: every component stored."""
        if not self._ready():
            return [False] * len(ids)
        present = [True] * len(ids)
        for st in self._stores:
            present = [a and b for a, b in zip(present, st.lookup(ids))]
        return present

    def leading(self, ids: List[bytes]) -> int:
        """The number of leading blocks present."""
        if not self._ready():
            return 0
        n = len(ids)
        for st in self._stores:
            n = min(n, st.lookup_on_prefix(ids[:n]))
        return n

    def prefetch(self, ids: List[bytes]) -> None:
        """Starts bringing disk blocks into the memory tiers (a hint)."""
        if self._ready():
            for st in self._stores:
                st.prefetch(ids)

    def start(self, kind: str, items: Sequence[Tuple[bytes, int, int]], event: int = 0) -> Handle:
        """Starts a ``load`` or ``dump`` of ``(block_id, component, address)``
        items; the memory stays allocated until ``finish``."""
        if not self._ready():
            raise RuntimeError(f"{self.root}: no block layout yet (no worker stored a block)")
        per: List[Tuple[List[bytes], List[int], List[int], Dict[Tuple[bytes, int], int]]] = [
            ([], [], [], {}) for _ in self._stores
        ]
        for bid, comp, addr in items:
            if not 0 <= comp < len(self._where):
                raise ValueError(f"component {comp}: a block has {len(self._where)}")
            k, shard = self._where[comp]
            ids, shards, addrs, names = per[k]
            ids.append(bid)
            shards.append(shard)
            addrs.append(addr)
            names[(bid, shard)] = comp
        parts = []
        try:
            for st, (ids, shards, addrs, names) in zip(self._stores, per):
                if not ids:
                    continue
                if kind == "load":
                    t = st.load(ids, shards, addrs)
                else:
                    t = st.dump(ids, shards, addrs, event=event)
                    event = 0  # waited for once, before the first store's copies
                parts.append((st, t, names))
        except BaseException:
            for st, t, _ in parts:  # nothing may copy after a refusal
                st.wait(t)
            raise
        return Handle(kind, parts)

    def check(self, h: Handle) -> bool:
        """True once every part of the transfer has completed."""
        return all(st.check(t) for st, t, _ in h.parts)

    def finish(self, h: Handle, durable: bool = False) -> List[Tuple[bytes, int, str, str]]:
        """Waits for the transfer; returns ``(block_id, component, kind,
        detail)`` for every item that did not succeed. ``durable``: a dump
        also waits for its blocks to be on disk (loads ignore it)."""
        out = []
        for st, t, names in h.parts:
            for bid, shard, kind, detail in st.wait(t, durable=durable):
                out.append((bytes(bid), names.get((bytes(bid), shard), -1), kind, detail))
        return out

    def counters(self) -> List[dict]:
        """Each store's counters, by component size."""
        return [dict(st.counters(), component_bytes=st.geometry[0]) for st in self._stores]

    def settle(self) -> None:
        """Waits for every transfer in flight."""
        for st in self._stores:
            st.settle()
