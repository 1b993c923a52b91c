"""The Global Master service: job submission (REST), placement by the GM core, launches to LMs (REST), deltas and
completions (RabbitMQ)."""
