"""Stand-ins for vLLM's ``KVCacheConfig`` and its groups, as the connector
reads them (``kv_cache_groups``, each with ``layer_names`` and
``kv_cache_spec``), for tests that run without an engine."""


class Group:
    """One KV-cache group: its layers and its (real) vLLM spec object."""

    def __init__(self, names, spec):
        self.layer_names = names
        self.kv_cache_spec = spec


class KvConfig:
    """A ``KVCacheConfig`` of the given groups."""

    def __init__(self, groups):
        self.kv_cache_groups = groups
