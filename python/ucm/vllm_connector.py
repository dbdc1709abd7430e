"""UCM as a vLLM KV connector (``KVConnectorBase_V1`` with ``SupportsHMA``,
so vLLM keeps its hybrid allocator on).

Use::

    from vllm import LLM
    from vllm.config import KVTransferConfig
    llm = LLM(model=..., kv_transfer_config=KVTransferConfig(
        kv_connector="UcmConnector", kv_connector_module_path="ucm.vllm_connector",
        kv_role="kv_both", kv_connector_extra_config={"dir": "/var/lib/ucm"}))

``kv_connector_extra_config`` keys: ``dir`` (the store directory; or the
``UCM_DIR`` environment variable), ``spec`` (a spec file replacing the one
derived from vLLM's ``KVCacheConfig``), ``model_id`` (the model's name in
the hashes; default: vLLM's model path), ``identity`` (a dict of names to
strings added to the deployment's cache identity, which the connector builds
from vLLM's config: revision, weights fingerprint, quantization, position
encoding, each group's KV dtype and layout; see ``ucm.identity``), ``pool_bytes``, ``disk_blocks``,
``lookahead``, ``remote`` (a Redis or Valkey cluster below the disk,
``redis://host:port,...``; or ``UCM_REMOTE``), ``cold`` (an S3 bucket below
that, ``s3://bucket/prefix?endpoint=...``; or ``UCM_COLD``), ``no_disk``
(those tiers instead of a local disk) and ``sync_mode`` (how the disk tier
makes writes durable: ``auto``, one ``syncfs`` per batch where the file
system allows, or ``files``, an fsync per file and directory, for a store
on a busy shared file system; or ``UCM_SYNC_MODE``), and ``load_mode``
(``auto``, ``sync`` or ``async``). Any other key is logged as unknown at
WARNING and otherwise ignored.

Every hook calls the Rust adapter. The scheduler side resolves hits and
builds each step's metadata (bytes, so it can cross to worker processes);
the worker side loads before each attention layer and saves after it.
Layers without hooks (Mamba) load when the step starts and save when it
ends. Loads are synchronous: they complete within the step, and a failed
load is reported through ``get_block_ids_with_load_errors`` so vLLM
recomputes it; a save is out of the engine's memory when ``wait_for_save``
returns, so vLLM may free a finished request's blocks at once.

Seeing hits: each request that UCM serves is logged at INFO (``ucm: request
ID: N of its M prompt tokens from cache``), and ``metrics_text(dir)`` returns
the Prometheus text of the caches, also when vLLM runs its engine in another
process (its default): that process publishes them to
``<dir>/metrics.<pid>.prom`` at most once a second.

Blocks completed by decoding are saved like prompt blocks (a chat's next
turn re-sends the answer), and so are states where a step ends on the
checkpoint grid. A recurrent state exists only where a step ends, and
vLLM prefills a prompt in one step: with ``scheduler_cls=
"ucm.vllm_scheduler.UcmScheduler"`` the steps also end where retention
plans a checkpoint (``chunk_stops``), so a later prompt that shares a
prefix and diverges resumes at the last planned point before it. Limit of
this version: a preempted request is not re-planned.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

import ucm
from ucm.identity import with_identity
from ucm.vllm_layout import page_view, plan_from_kv_cache_config

try:
    from vllm.logger import init_logger

    logger = init_logger("vllm.ucm")
except ImportError:  # pragma: no cover - vLLM always has it
    logger = logging.getLogger("ucm.vllm")

_CACHES: dict[tuple, Any] = {}
_CACHES_LOCK = threading.Lock()


def shared_cache(spec_toml: str, directory: str, tp_size: int, opts: dict) -> Any:
    """One ``ucm.Cache`` per spec and directory in this process, shared by
    the scheduler-side and worker-side connectors."""
    key = (spec_toml, os.path.realpath(directory), tp_size)
    with _CACHES_LOCK:
        c = _CACHES.get(key)
        if c is None:
            os.makedirs(directory, exist_ok=True)
            c = ucm.Cache(
                ucm.SpecTable.from_toml(spec_toml),
                directory,
                tp_size=tp_size,
                pool_bytes=int(opts.get("pool_bytes", 256 << 20)),
                disk_blocks=int(opts.get("disk_blocks", 1 << 20)),
                lookahead=int(opts.get("lookahead", 2)),
                remote=opts.get("remote") or os.environ.get("UCM_REMOTE") or None,
                cold=opts.get("cold") or os.environ.get("UCM_COLD") or None,
                no_disk=bool(opts.get("no_disk", False)),
                sync_mode=str(opts.get("sync_mode") or os.environ.get("UCM_SYNC_MODE") or "auto"),
            )
            _CACHES[key] = c
        return c


METRICS_FILE_PREFIX = "metrics."
METRICS_FILE_SUFFIX = ".prom"
_METRICS_EVERY_S = 1.0


def _metrics_path(directory: str) -> str:
    """The file where this process publishes its caches' metrics under the
    store directory: ``metrics.<pid>.prom``."""
    return os.path.join(directory, f"{METRICS_FILE_PREFIX}{os.getpid()}{METRICS_FILE_SUFFIX}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def metrics_text(directory: str | None = None) -> str:
    """The Prometheus text of UCM's caches: those of this process, and,
    with ``directory`` (the store directory; default ``UCM_DIR``), those of
    the live processes that publish it there. Under vLLM's engine
    multiprocessing (its default) the cache lives in the engine-core
    process, which publishes its metrics to ``<dir>/metrics.<pid>.prom`` at
    most once a second; a process that exited leaves nothing counted."""
    with _CACHES_LOCK:
        parts = [c.metrics_text() for c in _CACHES.values()]
        mine = {os.path.realpath(k[1]) for k in _CACHES}
    directory = directory or os.environ.get("UCM_DIR")
    if directory and os.path.isdir(directory) and os.path.realpath(directory) not in mine:
        for name in sorted(os.listdir(directory)):
            if not (name.startswith(METRICS_FILE_PREFIX) and name.endswith(METRICS_FILE_SUFFIX)):
                continue
            pid = name[len(METRICS_FILE_PREFIX) : -len(METRICS_FILE_SUFFIX)]
            if not pid.isdigit() or not _pid_alive(int(pid)):
                continue
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    parts.append(f.read(16 << 20))
            except OSError:
                continue
    return "".join(parts)


class _MetricsPublisher:
    """Writes a cache's metrics to ``<dir>/metrics.<pid>.prom`` (written
    whole, then renamed into place) at most once per interval, and removes
    the file when the process exits."""

    def __init__(self, cache, directory: str):
        self._cache = cache
        self._path = _metrics_path(directory)
        self._last = 0.0
        import atexit

        atexit.register(self._remove)
        # Files of processes that died without removing theirs.
        for name in os.listdir(directory):
            pid = name[len(METRICS_FILE_PREFIX) : -len(METRICS_FILE_SUFFIX)]
            if (
                name.startswith(METRICS_FILE_PREFIX)
                and name.endswith(METRICS_FILE_SUFFIX)
                and pid.isdigit()
                and not _pid_alive(int(pid))
            ):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass

    def maybe_publish(self, force: bool = False) -> None:
        import time

        now = time.monotonic()
        if not force and now - self._last < _METRICS_EVERY_S:
            return
        self._last = now
        tmp = f"{self._path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self._cache.metrics_text())
            os.replace(tmp, self._path)
        except OSError as e:
            logger.debug("ucm: metrics not published to %s: %s", self._path, e)

    def _remove(self) -> None:
        for p in (self._path, f"{self._path}.tmp"):
            try:
                os.unlink(p)
            except OSError:
                pass


_PUBLISHERS: dict[str, _MetricsPublisher] = {}


def _publisher(cache, directory: str) -> _MetricsPublisher:
    key = os.path.realpath(directory)
    with _CACHES_LOCK:
        p = _PUBLISHERS.get(key)
        if p is None:
            p = _PUBLISHERS[key] = _MetricsPublisher(cache, directory)
        return p


class UcmConnectorMetadata(KVConnectorMetadata):
    """One step's metadata: the adapter's encoded step, and the engine
    blocks or state slots the step's loads write, per group, where a
    subclass asked for them (``_loads_planned``; empty otherwise)."""

    def __init__(self, payload: bytes, loads: dict[int, list[int]]):
        self.payload = payload
        self.loads = loads


class UcmConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's connector contract over UCM's Rust adapter."""

    #: The ``kv_connector_extra_config`` keys this connector reads (a
    #: subclass that reads more adds its own).
    EXTRA_KEYS = frozenset(
        {"dir", "spec", "model_id", "identity", "pool_bytes", "disk_blocks", "lookahead",
         "remote", "cold", "no_disk", "sync_mode", "load_mode"}
    )

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        unknown = sorted(str(k) for k in extra if k not in self.EXTRA_KEYS)
        if unknown:
            logger.warning("ucm: unknown kv_connector_extra_config keys ignored: %s", ", ".join(unknown))
        directory = extra.get("dir") or os.environ.get("UCM_DIR")
        if not directory:
            raise ValueError(
                "ucm: set kv_connector_extra_config['dir'] (or UCM_DIR) to the store directory"
            )
        if kv_cache_config is None:
            raise ValueError("ucm: this vLLM did not pass a KVCacheConfig to the connector")
        tp = int(vllm_config.parallel_config.tensor_parallel_size)
        model = str(extra.get("model_id") or vllm_config.model_config.model)
        self._plan = plan_from_kv_cache_config(kv_cache_config, model, tp)
        toml = self._plan.toml
        if extra.get("spec"):
            with open(extra["spec"], encoding="utf-8") as f:
                toml = f.read()
        toml = with_identity(toml, vllm_config, kv_cache_config, self._plan, extra.get("identity"))
        self._cache = shared_cache(toml, directory, tp, extra)
        self._metrics = _publisher(self._cache, directory)
        mode = extra.get("load_mode", "auto")
        if mode not in ("auto", "sync", "async"):
            raise ValueError(f"ucm: load_mode `{mode}` (auto, sync or async)")
        # vLLM recovers from block-level load failures of sync loads only
        # with one KV-cache group; a hybrid model's failed load is reported
        # per request, which vLLM takes for asynchronous loads only.
        self._async = mode == "async" or (
            mode == "auto" and len(kv_cache_config.kv_cache_groups) > 1
        )
        self._load_errors: list = []
        self._identity_noted = False
        self._identity_checked = None
        # Scheduler side.
        self._sched = None
        self._reqs: dict[str, dict] = {}
        # Worker side.
        self._worker = None
        self._kv: dict[int, Any] = {}
        self._hookless: list[int] = []
        self._started = None
        self._saved: set[int] = set()
        self._pending_finished: set[str] = set()
        if role == KVConnectorRole.SCHEDULER:
            self._sched = self._cache.scheduler()
        else:
            rank = 0
            if tp > 1:
                from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

                rank = get_tensor_model_parallel_rank()
            self._worker = self._cache.worker(rank=rank)
        logger.info("ucm: %s side on %s, spec:\n%s", role, directory, toml)

    # ---- scheduler side -------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens = list(request.prompt_token_ids or [])
        if not tokens:
            return 0, False
        n = self._sched.get_num_new_matched_tokens(
            request.request_id,
            tokens,
            int(num_computed_tokens),
            cache_salt=getattr(request, "cache_salt", None),
        )
        stops = self._sched.checkpoint_positions(request.request_id)
        logger.debug(
            "ucm: request %s: %d tokens, %d computed, %d served, checkpoints at %s",
            request.request_id,
            len(tokens),
            num_computed_tokens,
            n,
            stops,
        )
        if n == 0 and num_computed_tokens == 0 and not self._identity_noted:
            # Once: a miss may be another deployment's data (another
            # revision, dtype, ... of the same model) in the same store.
            # The directory is looked at on a miss at most every 10 minutes.
            now = time.monotonic()
            if self._identity_checked is None or now - self._identity_checked > 600:
                self._identity_checked = now
                note = self._cache.identity_note()
                if note:
                    self._identity_noted = True
                    logger.info("ucm: request %s served nothing; %s", request.request_id, note)
        if n > 0 and request.request_id not in self._reqs:
            logger.info(
                "ucm: request %s: %d of its %d prompt tokens from cache (%d held by vLLM)",
                request.request_id,
                int(num_computed_tokens) + int(n),
                len(tokens),
                int(num_computed_tokens),
            )
        self._metrics.maybe_publish()
        self._reqs[request.request_id] = {
            "req": request,
            "n": len(tokens),
            "have": int(num_computed_tokens),
            "hit": int(n),
            "stops": stops,
        }
        return int(n), bool(self._async and n > 0)

    def chunk_stops(self, req_id: str) -> list[int]:
        """Prompt positions, ascending, where a prefill chunk of `req_id`
        should end so that its recurrent states can be kept there
        (retention's plan; read by ``ucm.vllm_scheduler``). Empty for a
        request the connector has not seen."""
        st = self._reqs.get(req_id)
        return st["stops"] if st is not None else []

    def _placement(self, ids) -> tuple[dict[int, list[int]], dict[int, int]]:
        chain: dict[int, list[int]] = {}
        slots: dict[int, int] = {}
        for sg, g in enumerate(self._plan.groups):
            b = list(ids[g.vllm_index]) if g.vllm_index < len(ids) else []
            if g.kind == "chain":
                chain[sg] = b
            elif b:
                # The request's state lives in its last block of the group.
                slots[sg] = b[-1]
        return chain, slots

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        chain, slots = self._placement(blocks.get_block_ids())
        if "blocks" in st:
            # The second call of an asynchronous load: the rest of the prompt.
            self._sched.update_allocation(request.request_id, chain, slots)
        else:
            self._sched.update_state_after_alloc(
                request.request_id, chain, slots, int(num_external_tokens)
            )
            st["ext"] = int(num_external_tokens)
            st["async_load"] = self._async and num_external_tokens > 0
        st["blocks"] = chain
        st["slots"] = slots

    def build_connector_meta(self, scheduler_output):
        chunks = []
        loads: dict[int, list[int]] = {}
        sched = scheduler_output.num_scheduled_tokens

        def grow(req_id, ids, replace):
            st = self._reqs.get(req_id)
            if st is None or "blocks" not in st or ids is None:
                return
            if replace:
                chain, slots = self._placement(ids)
            else:
                chain = {sg: list(b) for sg, b in st["blocks"].items()}
                add, slots = self._placement(ids)
                for sg, b in add.items():
                    chain.setdefault(sg, []).extend(b)
                slots = {**st["slots"], **slots}
            if chain != st["blocks"] or slots != st["slots"]:
                self._sched.update_allocation(req_id, chain, slots)
                st["blocks"], st["slots"] = chain, slots

        min_block = min(g.block_size for g in self._plan.groups if g.kind == "chain")

        def chunk(req_id, start):
            st = self._reqs.get(req_id)
            if st is None or "blocks" not in st:
                return
            end = start + int(sched.get(req_id, 0))
            if end > st["n"] and end // min_block > st["n"] // min_block:
                # Decoding completes a block: its tokens join the request.
                all_tokens = list(st["req"].all_token_ids)[:end]
                if len(all_tokens) == end:
                    self._sched.extend_tokens(req_id, all_tokens)
                    st["n"] = end
            end = min(end, st["n"])
            if start < end:
                chunks.append((req_id, int(start), int(end)))
            if st.pop("ext", 0) > 0 and not self._async:
                self._loads_planned(st, loads)

        for r in scheduler_output.scheduled_new_reqs:
            grow(r.req_id, r.block_ids, True)
            chunk(r.req_id, r.num_computed_tokens)
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            grow(rid, cached.new_block_ids[i], rid in cached.resumed_req_ids)
            chunk(rid, cached.num_computed_tokens[i])
        # Asynchronous loads: the request is not computed in this step; its
        # load runs now, and it is reported through get_finished.
        for rid, st in self._reqs.items():
            if st.pop("async_load", False):
                p = st["have"] + st["hit"]
                chunks.append((rid, p, p))
                self._loads_planned(st, loads)
        payload = self._sched.build_meta(chunks)
        return UcmConnectorMetadata(payload, loads)

    def _loads_planned(self, st, loads):
        """Called with a request's state when this step loads it, and the
        step's ``loads`` (group -> engine blocks or slots) to fill; a no-op
        here. A subclass that instruments the loads (the negative controls
        of ``scripts/vllm_e2e.py``) records their targets."""

    def request_finished(self, request, block_ids):
        self._finish(request.request_id)
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        self._finish(request.request_id)
        return False, None

    def _finish(self, req_id):
        self._reqs.pop(req_id, None)
        if self._sched is not None:
            self._sched.request_finished(req_id)

    # ---- worker side ----------------------------------------------------

    def register_kv_caches(self, kv_caches):
        page_of = {n: g.page_bytes for g in self._plan.groups for n in g.layer_names}
        regs = []
        for name, value in kv_caches.items():
            layer = self._plan.layer_of.get(name)
            if layer is None:
                raise ValueError(f"ucm: vLLM registered layer `{name}`, unknown to the spec")
            view = page_view(name, value, page_of[name])
            regs.append((layer, view, 0))
            self._kv[layer] = view
        self._worker.register_kv_caches(regs)
        hooked = self._plan.hooked_layers
        self._hookless = sorted(set(self._kv) - hooked)

    def _ensure_started(self) -> bool:
        """Starts the bound step once: vLLM calls start_load_kv before the
        forward only in steps with loads, and after it otherwise."""
        if self._worker is None or not self.has_connector_metadata():
            return False
        meta = self._get_connector_metadata()
        if self._started is meta:
            return True
        self._started = meta
        self._saved = set()
        self._worker.start_load_kv(meta.payload)
        # Layers without hooks load now; with asynchronous loads, every
        # layer does (the loading requests are not computed this step).
        for layer in sorted(self._kv) if self._async else self._hookless:
            self._worker.wait_for_layer_load(layer)
            self._layer_loaded(layer, at_start=True)
        return True

    def start_load_kv(self, forward_context, **kwargs):
        self._ensure_started()

    def wait_for_layer_load(self, layer_name):
        if not self._ensure_started():
            return
        layer = self._plan.layer_of.get(layer_name)
        if layer is None:
            return
        self._worker.wait_for_layer_load(layer)
        self._layer_loaded(layer, at_start=False)

    def _layer_loaded(self, layer, at_start):
        """Called once ``layer``'s loads of this step are in the engine's
        memory (``at_start``: by the step's start, for layers without hooks
        or asynchronous loads); a no-op here, for instrumenting
        subclasses."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if not self._ensure_started():
            return
        layer = self._plan.layer_of.get(layer_name)
        if layer is None or layer in self._saved:
            return
        self._worker.save_kv_layer(layer)
        self._saved.add(layer)

    def wait_for_save(self):
        if self._worker is None or self._started is None or not self.has_connector_metadata():
            return
        if self._started is not self._get_connector_metadata():
            return
        for layer in self._hookless:
            if layer not in self._saved:
                self._worker.save_kv_layer(layer)
                self._saved.add(layer)
        self._worker.wait_for_save()
        self._metrics.maybe_publish()

    def _poll(self, finished_req_ids):
        """Finished saves and loads, and this step's load errors."""
        self._pending_finished |= set(finished_req_ids)
        saved, failed, loaded = self._worker.get_finished(sorted(self._pending_finished))
        for req, why in failed:
            logger.warning("ucm: saving request %s failed: %s (a later miss, not an error)", req, why)
        self._pending_finished -= set(saved) | {r for r, _ in failed}
        errs = self._worker.load_errors()
        for req, group, block, cause in errs:
            logger.warning(
                "ucm: request %s: block %d of group %d failed to load (%s); vLLM recomputes it",
                req,
                block,
                group,
                cause,
            )
        self._load_errors = errs
        return set(loaded), {e[0] for e in errs}

    def get_finished(self, finished_req_ids):
        if self._worker is None:
            return None, None
        loaded, failed = self._poll(finished_req_ids)
        return None, (loaded | failed) if self._async else None

    def get_transfer_results(self, finished_req_ids):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorTransferResults,
        )

        if self._worker is None:
            return KVConnectorTransferResults()
        loaded, failed = self._poll(finished_req_ids)
        if not self._async:
            return KVConnectorTransferResults()
        return KVConnectorTransferResults(
            finished_recving=loaded | failed, failed_recving=failed
        )

    def get_block_ids_with_load_errors(self):
        if self._worker is None or self._async:
            return set()
        errs, self._load_errors = self._load_errors, []
        return {block for _, _, block, _ in errs}

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        """vLLM rebuilds the stats from their dict on the scheduler side."""
        return _stats(data or {})

    def get_kv_connector_stats(self):
        """What changed since the last call (vLLM sums the intervals)."""
        if self._worker is None:
            return None
        now = self._cache.metrics()
        now.pop("group_tokens", None)
        last = getattr(self, "_last_stats", {})
        self._last_stats = now
        delta = {k: v - last.get(k, 0) for k, v in now.items() if v != last.get(k, 0)}
        return _stats(delta) if delta else None

    def metrics_text(self) -> str:
        """This connector's cache metrics, in the Prometheus text format."""
        return self._cache.metrics_text()

    def shutdown(self):
        if self._worker is not None and self._started is not None:
            try:
                self._worker.wait_for_save()
            except Exception as e:  # noqa: BLE001 - shutting down: report, go on
                logger.warning("ucm: the last step's saves did not finish: %s", e)
        self._metrics.maybe_publish(force=True)


try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
except ImportError:  # pragma: no cover - a vLLM without connector stats
    KVConnectorStats = None

if KVConnectorStats is not None:

    class UcmStats(KVConnectorStats):
        """UCM's counters over an interval, as vLLM's connector stats."""

        def reset(self):
            self.data = {}

        def aggregate(self, other):
            for k, v in other.data.items():
                if isinstance(v, (int, float)):
                    self.data[k] = self.data.get(k, 0) + v
            return self

        def reduce(self):
            return {k: v for k, v in self.data.items() if isinstance(v, (int, float))}

        def is_empty(self):
            return not self.data


def _stats(data):
    """vLLM connector stats (where this vLLM has them) holding `data`."""
    if KVConnectorStats is None:
        return None
    return UcmStats(data=dict(data))
