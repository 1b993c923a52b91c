"""`python -m megha.services.worker`: run one worker agent, configured by MEGHA_* environment variables."""

from megha.services.run import serve_worker

serve_worker()
