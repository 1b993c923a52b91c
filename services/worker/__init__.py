"""The worker agent: runs the tasks an LM launches on its node, really consuming their CPU and memory.

`agent` talks to the LM and the broker; `executor` owns task execution (one OS process per task running `burn`,
or a driver's run), `simulated` the clearly named simulated mode, and `execution` what both share (a task's
`ExecutionResult`, the bookkeeping of running tasks); `burn` is the program a burn task runs. The other task
drivers (docs/drivers.md): `drivers` (their interface), `exec_driver` with `enforcement` (cgroups v2 or rlimits),
`memory_watch` (the rlimits' memory limit), `output_pump` (its output pipes) and `isolation` (a uid per run), and
`container_driver` (the Docker engine); `tasklogs` keeps their output; `metrics` is the agent's GET /metrics.
"""
