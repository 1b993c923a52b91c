"""Embedded mode: the whole Megha system (GMs, LMs, workers) in one process over the in-memory transport."""
