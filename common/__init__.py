"""Shared parts of Megha: the sans-I/O scheduling core and the transports that drive it."""
