"""Checks of values that come from the environment or a command line, light enough for the `megha` client to import
without the services' settings (pydantic): URLs, a host to bind, a secret's file."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import stat
from urllib.parse import urlsplit


def read_secret_file(path: str) -> str:
    """The text of the file at `path` without surrounding white space; OSError for one that is not a regular file
    (a FIFO or a device, whose read could wait for ever) or cannot be read, UnicodeDecodeError for one not UTF-8."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open would wait for a writer
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return file.read().decode().strip()


_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")


def check_host(host: str) -> str:
    """`host` if it is an IP address or a host name (RFC 1123 labels; not all digits and dots, which would be a bad
    IPv4 address); otherwise ValueError saying so."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return host
    if len(host) <= 253 and _HOST_NAME.fullmatch(host) and not re.fullmatch(r"[0-9.]+", host):
        return host
    raise ValueError(f"{host!r} is not an IP address or a host name")


def check_http_urls(urls: list[str]) -> list[str]:
    """`urls` if each is an http:// or https:// URL with a host; otherwise ValueError naming the first that is not."""
    for url in urls:
        try:
            parts = urlsplit(url)
        except ValueError as exc:  # an IPv6 host not closed ("http://[::1")
            raise ValueError(f"{url!r} is not a URL: {exc}") from None
        try:
            parts.port  # noqa: B018 (a port that is not a number raises ValueError)
        except ValueError:
            raise ValueError(f"{url!r} has a bad port") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return urls
