"""Drop-in for upstream UCM's store interface (``UcmKVStoreBaseV1``).

Deployments of the original UCM (ModelEngine-Group/unified-cache-management)
pick their store by module path and class name; this module offers
``UcmPipelineStore`` with the same methods and semantics, over UCM's own
BlockStore (crash-safe disk tier, checksums, durable waits):

- ``lookup(block_ids) -> list[bool]``, ``lookup_on_prefix(block_ids) -> int``
  (index of the last block of the present prefix, -1 if none);
- ``prefetch(block_ids)``: disk blocks brought into the memory tier;
- ``load``/``dump`` over ``tensors[i][j]`` and ``load_data``/``dump_data``
  over ``addrs[i][j]`` (a list of lists or a 2-D ``uint64`` array): tensor
  ``j`` of shard ``shard_index[i]`` of block ``block_ids[i]``; ``dump_data``
  takes a ``prerequisite_handle`` (an engine event; 0: none);
- ``wait(task)`` raises :class:`UcmStoreError` on any item that did not
  succeed (a missing block, a failed copy, a failed durable write);
  ``check(task)`` polls.

Geometry comes from the configuration dict as upstream's: ``block_size``
(bytes of a block), ``shard_size`` (bytes of one shard of it) and
``tensor_size`` (bytes of each tensor of a shard; default ``shard_size``).
``storage_backends`` names the directory (one). UCM's own keys, all
optional: ``ucm_device`` (``cpu`` or ``cuda[:N]``, default ``cpu``: whose
memory the addresses are), ``ucm_pool_bytes`` (default ``buffer_size``,
else 256 MiB), ``ucm_disk_blocks`` (block files before GC, default 2^20),
``ucm_durable_wait`` (a dump's ``wait`` returns once its blocks are on
disk, not just in the memory tier; default false), ``ucm_workers``.
``transfer_enable: False`` (a scheduler-side store) refuses transfers.

Each tensor of a shard is one shard of UCM's store (shard ``shard_index *
tensors_per_shard + j``), so a block's file holds every tensor of every
shard, and a block is present only once every shard was dumped, whatever
the tasks that carried them. Unlike upstream, one task may carry every
shard of a block without losing any.

When upstream's package is importable beside this one (``ucm.store`` on
the path; the ``ucm`` package extends its path to find it), the class
derives from upstream's ``UcmKVStoreBaseV1``, so upstream's factory
accepts it; otherwise from an identical local interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from ucm._ucm import BlockStore

try:  # upstream's interface, when its package is installed beside this one
    from ucm.store.ucmstore_v1 import Task as _Task  # type: ignore
    from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1 as _Base  # type: ignore

    UPSTREAM_INTERFACE = True
except ImportError:  # the same interface, for deployments without upstream
    UPSTREAM_INTERFACE = False

    class _Task(ABC):  # type: ignore[no-redef]
        """An opaque handle of a transfer, for ``wait`` and ``check``."""

    class _Base(ABC):  # type: ignore[no-redef]
        """Upstream UCM's store interface (``UcmKVStoreBaseV1``)."""

        def __init__(self, config: Dict[str, object]) -> None:
            self.config = config

        @abstractmethod
        def cc_store(self) -> int: ...

        @abstractmethod
        def lookup(self, block_ids: List[bytes]) -> List[bool]: ...

        @abstractmethod
        def lookup_on_prefix(self, block_ids: List[bytes]) -> int: ...

        @abstractmethod
        def prefetch(self, block_ids: List[bytes]) -> None: ...

        @abstractmethod
        def load(self, block_ids, shard_index, dst_tensor) -> "_Task": ...

        @abstractmethod
        def dump(self, block_ids, shard_index, src_tensor) -> "_Task": ...

        @abstractmethod
        def load_data(self, block_ids, shard_index, dst_addr) -> "_Task": ...

        @abstractmethod
        def dump_data(
            self, block_ids, shard_index, src_addr, prerequisite_handle: int = 0
        ) -> "_Task": ...

        @abstractmethod
        def wait(self, task: "_Task") -> None: ...

        @abstractmethod
        def check(self, task: "_Task") -> bool: ...

        @abstractmethod
        def need_register_kv_caches(self) -> bool: ...

        @abstractmethod
        def register_kv_caches(self, registrations: Any) -> None: ...


Task = _Task
UcmKVStoreBaseV1 = _Base


class UcmStoreError(RuntimeError):
    """A task had items that did not succeed; ``problems`` lists them as
    ``(block_id, shard_index, tensor, kind, detail)``."""

    def __init__(self, what: str, problems: list) -> None:
        self.problems = problems
        shown = "; ".join(
            f"block {b.hex()} shard {s} tensor {t}: {k} ({d})"
            for b, s, t, k, d in problems[:4]
        )
        more = f" and {len(problems) - 4} more" if len(problems) > 4 else ""
        super().__init__(f"{what}: {len(problems)} item(s) failed: {shown}{more}")


@dataclass
class UcmStoreTask(_Task):
    """A transfer in flight: its number in the store, and its kind."""

    task_id: int
    kind: str


def _positive_int(config: Dict[str, object], key: str, default=None) -> int:
    v = config.get(key, default)
    if v is None:
        raise ValueError(f"upstream store config: `{key}` is required")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"upstream store config: `{key}` must be a positive int, not {v!r}")
    return v


def _rows(addrs: Any) -> List[List[int]]:
    if hasattr(addrs, "tolist"):  # a numpy array (upstream passes uint64 2-D)
        addrs = addrs.tolist()
    return [[int(a) for a in row] for row in addrs]


class UcmPipelineStore(_Base):
    """UCM's BlockStore behind upstream UCM's ``UcmKVStoreBaseV1``."""

    def __init__(self, config: Dict[str, object]) -> None:
        super().__init__(config)
        block = _positive_int(config, "block_size")
        shard = _positive_int(config, "shard_size", block)
        tensor = _positive_int(config, "tensor_size", shard)
        if shard % tensor or block % shard:
            raise ValueError(
                f"upstream store config: block_size {block} must be a multiple of "
                f"shard_size {shard}, itself a multiple of tensor_size {tensor}"
            )
        backends = config.get("storage_backends")
        if isinstance(backends, str):
            backends = [backends]
        if not backends or not isinstance(backends, (list, tuple)):
            raise ValueError("upstream store config: `storage_backends` names the directory")
        if len(backends) != 1:
            raise ValueError(
                f"upstream store config: {len(backends)} storage_backends; UCM keeps one "
                "directory per store (put a shared filesystem behind it to spread load)"
            )
        self._tensor = tensor
        self._per_shard = shard // tensor
        self._shards = block // shard
        self._transfers = bool(config.get("transfer_enable", True))
        self._durable = bool(config.get("ucm_durable_wait", False))
        pool = config.get("ucm_pool_bytes", config.get("buffer_size", 256 << 20))
        self._store = BlockStore(
            str(backends[0]),
            tensor,
            block // tensor,
            pool_bytes=int(pool),
            disk_blocks=int(config.get("ucm_disk_blocks", 1 << 20)),
            workers=int(config.get("ucm_workers", 2)),
            device=str(config.get("ucm_device", "cpu")),
        )
        self._device = str(config.get("ucm_device", "cpu")).split(":")[0]
        # Per task: (block_id, shard_index, tensor) of each store item.
        self._items: Dict[int, Dict[tuple, tuple]] = {}

    # -- presence -----------------------------------------------------------

    def cc_store(self) -> int:
        """0: there is no upstream C++ ``Store*`` here (a Python-level store,
        as upstream's Python stores answer); upstream's C++ layers cannot be
        stacked on it."""
        return 0

    def lookup(self, block_ids: List[bytes]) -> List[bool]:
        """Presence of each block: every shard stored."""
        return self._store.lookup([bytes(b) for b in block_ids])

    def lookup_on_prefix(self, block_ids: List[bytes]) -> int:
        """Index of the last block of the leading run of present blocks;
        -1 when the first is missing."""
        return self._store.lookup_on_prefix([bytes(b) for b in block_ids]) - 1

    def prefetch(self, block_ids: List[bytes]) -> None:
        """Starts bringing disk blocks into the memory tier (a hint)."""
        self._store.prefetch([bytes(b) for b in block_ids])

    def need_register_kv_caches(self) -> bool:
        """False: addresses are taken per task, nothing is registered."""
        return False

    def register_kv_caches(self, registrations: Any) -> None:
        """Accepted and unused (see ``need_register_kv_caches``)."""

    # -- transfers ----------------------------------------------------------

    def _flatten(self, block_ids, shard_index, rows: List[List[int]]):
        if not (len(block_ids) == len(shard_index) == len(rows)):
            raise ValueError(
                f"{len(block_ids)} block ids, {len(shard_index)} shard indices and "
                f"{len(rows)} rows of addresses: one of each per block"
            )
        ids, shards, addrs, names = [], [], [], {}
        for b, s, row in zip(block_ids, shard_index, rows):
            b = bytes(b)
            s = int(s)
            if not 0 <= s < self._shards:
                raise ValueError(f"shard index {s}: a block has {self._shards} shard(s)")
            if len(row) != self._per_shard:
                raise ValueError(
                    f"block {b.hex()} shard {s}: {len(row)} tensor(s), a shard has "
                    f"{self._per_shard} of {self._tensor} bytes"
                )
            for j, a in enumerate(row):
                unit = s * self._per_shard + j
                ids.append(b)
                shards.append(unit)
                addrs.append(a)
                names[(b, unit)] = (b, s, j)
        return ids, shards, addrs, names

    def _tensor_rows(self, tensors: Sequence[Sequence[Any]]) -> List[List[int]]:
        rows = []
        for i, row in enumerate(tensors):
            out = []
            for j, t in enumerate(row):
                nbytes = t.numel() * t.element_size()
                if nbytes != self._tensor or not t.is_contiguous():
                    raise ValueError(
                        f"tensor [{i}][{j}]: {nbytes} bytes"
                        f"{'' if t.is_contiguous() else ', not contiguous'}; "
                        f"tensor_size is {self._tensor}"
                    )
                if t.device.type != self._device:
                    raise ValueError(
                        f"tensor [{i}][{j}] is on {t.device}; this store moves "
                        f"`{self._device}` memory (config `ucm_device`)"
                    )
                out.append(t.data_ptr())
            rows.append(out)
        return rows

    def _start(self, kind: str, block_ids, shard_index, rows, event: int = 0) -> UcmStoreTask:
        if not self._transfers:
            raise RuntimeError("this store was configured with transfer_enable=False")
        ids, shards, addrs, names = self._flatten(block_ids, shard_index, rows)
        if kind == "load":
            tid = self._store.load(ids, shards, addrs)
        else:
            tid = self._store.dump(ids, shards, addrs, event=int(event))
        self._items[tid] = names
        return UcmStoreTask(tid, kind)

    def load(self, block_ids, shard_index, dst_tensor) -> UcmStoreTask:
        """Starts copying each block's shard into ``dst_tensor[i][j]``."""
        return self._start("load", block_ids, shard_index, self._tensor_rows(dst_tensor))

    def dump(self, block_ids, shard_index, src_tensor) -> UcmStoreTask:
        """Starts storing ``src_tensor[i][j]`` as each block's shard."""
        return self._start("dump", block_ids, shard_index, self._tensor_rows(src_tensor))

    def load_data(self, block_ids, shard_index, dst_addr) -> UcmStoreTask:
        """As ``load``, to raw addresses; the memory stays allocated until
        ``wait``."""
        return self._start("load", block_ids, shard_index, _rows(dst_addr))

    def dump_data(
        self, block_ids, shard_index, src_addr, prerequisite_handle: int = 0
    ) -> UcmStoreTask:
        """As ``dump``, from raw addresses, after the engine event
        ``prerequisite_handle`` (0: the bytes are ready now)."""
        return self._start("dump", block_ids, shard_index, _rows(src_addr), prerequisite_handle)

    def wait(self, task: UcmStoreTask) -> None:
        """Blocks until the task ends; raises :class:`UcmStoreError` if any
        item did not succeed (nothing is silently partial)."""
        names = self._items.pop(task.task_id, None)
        if names is None:
            raise ValueError(f"task {task.task_id}: unknown or already waited for")
        report = self._store.wait(task.task_id, durable=self._durable and task.kind == "dump")
        if report:
            problems = [(*names[(bytes(b), s)], k, d) for b, s, k, d in report]
            raise UcmStoreError(f"{task.kind} task {task.task_id}", problems)

    def check(self, task: UcmStoreTask) -> bool:
        """True once the task has finished (``wait`` then returns at once)."""
        if task.task_id not in self._items:
            raise ValueError(f"task {task.task_id}: unknown or already waited for")
        return self._store.check(task.task_id)

    def counters(self) -> dict:
        """UCM's store counters (pool hits, disk reads, misses, ...)."""
        return self._store.counters()

    def close(self) -> None:
        """Waits for every task in flight (the memory may be freed after)."""
        self._store.settle()
        self._items.clear()


__all__ = [
    "Task",
    "UcmKVStoreBaseV1",
    "UcmPipelineStore",
    "UcmStoreError",
    "UcmStoreTask",
    "UPSTREAM_INTERFACE",
]
