"""Data shipped with the package: the Sharma et al. constraint statistics (so a fresh clone needs no ../shared)."""
