"""The Local Master service: worker registration, launch validation (REST), reports and deltas (RabbitMQ)."""
