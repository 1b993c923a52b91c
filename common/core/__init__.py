"""Megha's scheduling core: GM and LM decision logic as pure, deterministic state machines (no I/O, no clock)."""
