"""UCM: a KV-cache storage engine for hybrid LLMs.

The native part (`ucm._ucm`, Rust through pyo3) holds the spec table,
hashing, the cache with its scheduler and worker sides, and metrics. The
vLLM connector is `ucm.vllm_connector.UcmConnector`. The drop-ins for the
engines' other plug-in points are `ucm.upstream.UcmPipelineStore` (upstream
UCM's store interface) and `ucm.sglang_hicache.UcmHiCacheStorage` (SGLang's
HiCache storage backend), both over `BlockStore`.
"""

# Upstream UCM's package is also named `ucm`: installed in another
# directory behind this one, its subpackages (`ucm.store`, `ucm.integration`)
# stay importable, so its connector can run with this package's store.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from ucm._ucm import (  # noqa: F401
    BlockStore,
    Cache,
    DiskBudget,
    Scheduler,
    SpecTable,
    Worker,
    abi_version,
    block_ids,
    checkpoint_hash,
)

__all__ = [
    "BlockStore",
    "Cache",
    "DiskBudget",
    "Scheduler",
    "SpecTable",
    "Worker",
    "abi_version",
    "block_ids",
    "checkpoint_hash",
]
