"""Megha's services: GM, LM and worker agent wrapping the scheduling core (FastAPI, aio-pika, http.py)."""
