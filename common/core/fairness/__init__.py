"""Global fair scheduling (Megha paper, section IV-C and Algorithm 2): user queues with shares, share policies,
and the accounting a GM and an LM keep to decide and verify preemptions."""
