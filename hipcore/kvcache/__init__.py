"""The paged KV cache: block pool, block tables, the KvCache and its MemoryProfile."""
