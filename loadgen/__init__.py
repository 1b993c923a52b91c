"""The load generator: trace replay, workload shaping (constraints, resources) and the measurements users feel."""
