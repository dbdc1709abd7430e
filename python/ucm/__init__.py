"""UCM: a KV-cache storage engine for hybrid LLMs.

The native part (`ucm._ucm`, Rust through pyo3) holds the spec table,
hashing, the cache with its scheduler and worker sides, and metrics. The
vLLM connector is `ucm.vllm_connector.UcmConnector`.
"""

from ucm._ucm import (  # noqa: F401
    Cache,
    Scheduler,
    SpecTable,
    Worker,
    abi_version,
    block_ids,
    checkpoint_hash,
)

__all__ = [
    "Cache",
    "Scheduler",
    "SpecTable",
    "Worker",
    "abi_version",
    "block_ids",
    "checkpoint_hash",
]
