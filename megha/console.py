"""The `megha` console script: `megha.cli.script`, imported with the cyclic collector off.

Importing the command line (click, pydantic and the settings models, numpy, the cores) builds some hundred
thousand objects that live as long as the process: modules, classes, functions. With the collector on, those
allocations trigger about 120 collections meanwhile, a full one among them, which trace them again and again
(a tenth of the imports' time). They are frozen instead (`gc.freeze`: never traced again) once imported, and the
collector comes back on for the command. Only the console script imports this module; `python -m megha.cli` and
callers of `megha.cli.main` are unchanged."""

import gc

gc.disable()
from megha.cli import script  # noqa: E402

gc.freeze()
gc.enable()

__all__ = ["script"]
