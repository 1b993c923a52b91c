"""Placement as a pipeline: feasibility -> choice -> plan; the LM validates (see megha.common.core.lm)."""
