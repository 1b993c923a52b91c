#!/usr/bin/env python3
"""The Megha image's HEALTHCHECK: GET /healthz of the HTTP service this container runs.

The role comes from the container's command line (`python -m megha.services.lm`, `megha lm`, ...), the port from
MEGHA_PORT or the role's default. A container that runs no HTTP service (the load generator, `megha --help`) is
healthy as long as it runs. Installed as /opt/megha/bin/megha-healthcheck; standard library only.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

DEFAULT_PORTS = {"gm": 8000, "lm": 8100, "worker": 8200}
"""Roles that serve HTTP -> their MEGHA_PORT default (megha/common/settings.py)."""


def role(argv: list[str]) -> str | None:
    """'gm', 'lm' or 'worker' when the command runs that service, else None."""
    for i, arg in enumerate(argv):
        if arg.startswith("megha.services.") and arg.removeprefix("megha.services.") in DEFAULT_PORTS:
            return arg.removeprefix("megha.services.")
        if Path(arg).name == "megha" and i + 1 < len(argv) and argv[i + 1] in DEFAULT_PORTS:
            return argv[i + 1]
    return None


def main() -> int:
    # PID 1 is tini (or docker-init); its command line holds the service's whole command.
    argv = [a.decode(errors="replace") for a in Path("/proc/1/cmdline").read_bytes().split(b"\0") if a]
    served = role(argv)
    if served is None:
        return 0
    port = os.environ.get("MEGHA_PORT") or str(DEFAULT_PORTS[served])
    host = os.environ.get("MEGHA_HOST", "127.0.0.1")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
