"""`python -m megha.services.gm`: run one GM, configured by MEGHA_* environment variables."""

from megha.services.run import serve_gm

serve_gm()
