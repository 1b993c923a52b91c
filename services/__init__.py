"""Megha's services: GM, LM and worker agent wrapping the scheduling core (FastAPI, aio-pika, the HTTP client in `http.py`)."""
