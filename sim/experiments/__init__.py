"""Experiments: each one command that replays traces through the simulator and writes CSV, PNG plots and a
markdown table under `docs/results/`."""
