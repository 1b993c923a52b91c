"""Transports that carry core messages between GMs, LMs and workers."""
