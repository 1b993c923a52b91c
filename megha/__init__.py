"""Megha: a federated, eventually-consistent scheduler for heterogeneous data centres."""

__version__ = "0.1.0"
