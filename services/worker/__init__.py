"""The worker agent: runs the tasks an LM launches on its node, really consuming their CPU and memory.

`agent` talks to the LM and the broker; `executor` owns task execution (one OS process per task running `burn`,
or the clearly named simulated mode); `burn` is the program a burn task runs. The other task drivers
(docs/drivers.md): `drivers` (their interface), `exec_driver` with `enforcement` (cgroups v2 or rlimits), and
`container_driver` (the Docker engine); `tasklogs` keeps their output.
"""
