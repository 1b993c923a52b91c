"""`megha reproduce`: every result figure and table of the two Megha papers, by id, on the simulator.

`catalogue` names the ids and their set-ups, `paper` the papers' numbers, `fair`, `constraints` and `load` run
them (reusing `megha.sim.experiments`), `outcome` keeps one replay's figures, `result` writes an id's files and
compares, `runner` ties them together; `megha/ctl/reproduce.py` is the command. docs/reproduce.md describes it.
"""
