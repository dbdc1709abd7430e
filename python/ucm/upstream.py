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

Keys are upstream's: the block ids upstream's connector computes are
stored as given, so this module adds no cache identity of its own (the
deployment's identity is what upstream's connector hashes into its ids).
Use UCM's own vLLM connector (``ucm.vllm_connector``) for ids that carry
the model revision, weights fingerprint, quantization, KV dtype, layout
and position encoding.

Geometry comes from the configuration dict as upstream's: ``block_size``
(bytes of a block), ``shard_size`` (bytes of one shard of it) and the
tensors of a shard, ``tensor_size_list`` (bytes of each, as upstream's
connector passes them) or ``tensor_size`` (all equal; default
``shard_size``). A store given only ``block_size`` (upstream's scheduler
side) looks blocks up in the layout the workers recorded. ``storage_backends``
names the directory (one; a list or a colon-separated string). UCM's own keys, all
optional: ``ucm_device`` (``cpu`` or ``cuda[:N]``, default ``cpu``: whose
memory the addresses are), ``ucm_pool_bytes`` (default ``buffer_size``,
else 256 MiB), ``ucm_disk_blocks`` (block files before GC, default 2^20),
``ucm_durable_wait`` (a dump's ``wait`` returns once its blocks are on
disk, not just in the memory tier; default false), ``ucm_workers``,
``ucm_sync_mode`` (how the disk tier makes writes durable: ``auto``, one
``syncfs`` per batch where the file system allows, or ``files``, an fsync
per file and directory, for a store on a busy shared file system).
``transfer_enable: False`` (a scheduler-side store) refuses transfers.

Each tensor of a shard is one component of the block (``shard_index *
tensors_per_shard + j``; tensors of different sizes live in different
BlockStores, see ``ucm._components``), and a block is present only once
every shard was dumped, whatever the tasks that carried them. Unlike upstream, one task may carry every
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

from ucm._components import ComponentStores, Handle

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
        tensors = self._tensor_sizes(config, block)
        backends = config.get("storage_backends")
        if isinstance(backends, str):
            backends = [b for b in backends.split(":") if b]
        if not backends or not isinstance(backends, (list, tuple)):
            raise ValueError("upstream store config: `storage_backends` names the directory")
        if len(backends) != 1:
            raise ValueError(
                f"upstream store config: {len(backends)} storage_backends; UCM keeps one "
                "directory per store (put a shared filesystem behind it to spread load)"
            )
        self._transfers = bool(config.get("transfer_enable", True))
        self._durable = bool(config.get("ucm_durable_wait", False))
        self._device = str(config.get("ucm_device", "cpu"))
        pool = config.get("ucm_pool_bytes", config.get("buffer_size", 256 << 20))
        self._tensors = tensors
        sizes = None if tensors is None else tensors * (block // sum(tensors))
        self._store = ComponentStores(
            str(backends[0]),
            sizes,
            pool_bytes=int(pool),
            disk_blocks=int(config.get("ucm_disk_blocks", 1 << 20)),
            workers=int(config.get("ucm_workers", 2)),
            device=self._device,
            sync_mode=str(config.get("ucm_sync_mode", "auto")),
        )
        self._tasks: Dict[int, Handle] = {}
        self._next = 1

    @staticmethod
    def _tensor_sizes(config: Dict[str, object], block: int):
        """The bytes of each tensor of a shard, or None when the config
        gives only ``block_size``."""
        if not any(k in config for k in ("tensor_size_list", "tensor_size", "shard_size")):
            return None
        shard = _positive_int(config, "shard_size") if "shard_size" in config else None
        if "tensor_size_list" in config:
            ts = config["tensor_size_list"]
            if not isinstance(ts, (list, tuple)) or not ts:
                raise ValueError("upstream store config: `tensor_size_list` is a list of byte sizes")
            tensors = [_positive_int({"tensor_size_list": t}, "tensor_size_list") for t in ts]
        else:
            shard = shard or block
            t = _positive_int(config, "tensor_size", shard)
            if shard % t:
                raise ValueError(
                    f"upstream store config: shard_size {shard} must be a multiple of tensor_size {t}"
                )
            tensors = [t] * (shard // t)
        shard = shard or sum(tensors)
        if sum(tensors) != shard or block % shard:
            raise ValueError(
                f"upstream store config: block_size {block} must be a multiple of "
                f"shard_size {shard}, itself the sum of its tensors ({sum(tensors)})"
            )
        return tensors

    # -- presence -----------------------------------------------------------

    def cc_store(self) -> int:
        """0: there is no upstream C++ ``Store*`` here (a Python-level store,
        as upstream's Python stores answer); upstream's C++ layers cannot be
        stacked on it."""
        return 0

    def lookup(self, block_ids: List[bytes]) -> List[bool]:
        """Presence of each block: every shard stored."""
        return self._store.exists([bytes(b) for b in block_ids])

    def lookup_on_prefix(self, block_ids: List[bytes]) -> int:
        """Index of the last block of the leading run of present blocks;
        -1 when the first is missing."""
        return self._store.leading([bytes(b) for b in block_ids]) - 1

    def prefetch(self, block_ids: List[bytes]) -> None:
        """Starts bringing disk blocks into the memory tier (a hint)."""
        self._store.prefetch([bytes(b) for b in block_ids])

    def need_register_kv_caches(self) -> bool:
        """False: addresses are taken per task, nothing is registered."""
        return False

    def register_kv_caches(self, registrations: Any) -> None:
        """Accepted and unused (see ``need_register_kv_caches``)."""

    # -- transfers ----------------------------------------------------------

    def _geometry(self) -> List[int]:
        if not self._transfers:
            raise RuntimeError("this store was configured with transfer_enable=False")
        if self._tensors is None:
            raise RuntimeError(
                "this store was configured with block_size only (a scheduler side): "
                "transfers need shard_size and tensor_size(_list)"
            )
        return self._tensors

    def _items(self, block_ids, shard_index, rows: List[List[int]], sizes=None):
        tensors = self._geometry()
        shards = self._store.components // len(tensors)
        if not (len(block_ids) == len(shard_index) == len(rows)):
            raise ValueError(
                f"{len(block_ids)} block ids, {len(shard_index)} shard indices and "
                f"{len(rows)} rows of addresses: one of each per block"
            )
        items = []
        for i, (b, s, row) in enumerate(zip(block_ids, shard_index, rows)):
            b, s = bytes(b), int(s)
            if not 0 <= s < shards:
                raise ValueError(f"shard index {s}: a block has {shards} shard(s)")
            if len(row) != len(tensors):
                raise ValueError(
                    f"block {b.hex()} shard {s}: {len(row)} tensor(s), a shard has "
                    f"{len(tensors)} of {tensors} bytes"
                )
            for j, a in enumerate(row):
                if sizes is not None and sizes[i][j] != tensors[j]:
                    raise ValueError(
                        f"tensor [{i}][{j}]: {sizes[i][j]} bytes; tensor_size is {tensors[j]}"
                    )
                items.append((b, s * len(tensors) + j, a))
        return items

    def _tensor_rows(self, tensors: Sequence[Sequence[Any]]):
        rows, sizes = [], []
        for i, row in enumerate(tensors):
            out, size = [], []
            for j, t in enumerate(row):
                if not t.is_contiguous():
                    raise ValueError(f"tensor [{i}][{j}] is not contiguous")
                if t.device.type != self._device.split(":")[0]:
                    raise ValueError(
                        f"tensor [{i}][{j}] is on {t.device}; this store moves "
                        f"`{self._device}` memory (config `ucm_device`)"
                    )
                out.append(t.data_ptr())
                size.append(t.numel() * t.element_size())
            rows.append(out)
            sizes.append(size)
        return rows, sizes

    def _start(self, kind: str, items, event: int = 0) -> UcmStoreTask:
        h = self._store.start(kind, items, int(event))
        tid, self._next = self._next, self._next + 1
        self._tasks[tid] = h
        return UcmStoreTask(tid, kind)

    def load(self, block_ids, shard_index, dst_tensor) -> UcmStoreTask:
        """Starts copying each block's shard into ``dst_tensor[i][j]``."""
        rows, sizes = self._tensor_rows(dst_tensor)
        return self._start("load", self._items(block_ids, shard_index, rows, sizes))

    def dump(self, block_ids, shard_index, src_tensor) -> UcmStoreTask:
        """Starts storing ``src_tensor[i][j]`` as each block's shard."""
        rows, sizes = self._tensor_rows(src_tensor)
        return self._start("dump", self._items(block_ids, shard_index, rows, sizes))

    def load_data(self, block_ids, shard_index, dst_addr) -> UcmStoreTask:
        """As ``load``, to raw addresses; the memory stays allocated until
        ``wait``."""
        return self._start("load", self._items(block_ids, shard_index, _rows(dst_addr)))

    def dump_data(
        self, block_ids, shard_index, src_addr, prerequisite_handle: int = 0
    ) -> UcmStoreTask:
        """As ``dump``, from raw addresses, after the engine event
        ``prerequisite_handle`` (0: the bytes are ready now)."""
        items = self._items(block_ids, shard_index, _rows(src_addr))
        return self._start("dump", items, prerequisite_handle)

    def _handle(self, task: UcmStoreTask) -> Handle:
        h = self._tasks.get(getattr(task, "task_id", None))
        if h is None:
            raise ValueError(f"task {getattr(task, 'task_id', task)}: unknown or already waited for")
        return h

    def wait(self, task: UcmStoreTask) -> None:
        """Blocks until the task ends; raises :class:`UcmStoreError` if any
        item did not succeed (nothing is silently partial)."""
        h = self._handle(task)
        del self._tasks[task.task_id]
        report = self._store.finish(h, durable=self._durable)
        if report:
            per = len(self._tensors)
            problems = [(b, c // per, c % per, k, d) for b, c, k, d in report]
            raise UcmStoreError(f"{task.kind} task {task.task_id}", problems)

    def check(self, task: UcmStoreTask) -> bool:
        """True once the task has finished (``wait`` then returns at once)."""
        return self._store.check(self._handle(task))

    def counters(self) -> dict:
        """UCM's store counters, summed over the component stores."""
        out: Dict[str, int] = {}
        for c in self._store.counters():
            for k, v in c.items():
                if k != "component_bytes":
                    out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        """Waits for every task in flight (the memory may be freed after)."""
        self._store.settle()
        self._tasks.clear()


__all__ = [
    "Task",
    "UcmKVStoreBaseV1",
    "UcmPipelineStore",
    "UcmStoreError",
    "UcmStoreTask",
    "UPSTREAM_INTERFACE",
]
