"""`python -m megha.services.lm`: run one LM, configured by MEGHA_* environment variables."""

from megha.services.run import serve_lm

serve_lm()
