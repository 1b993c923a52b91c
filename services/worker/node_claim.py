"""The node numbers an agent's LM gave it, kept in a file so that the agent claims them again after its own restart.

An LM numbers its nodes in the order its agents register (`megha.services.lm.membership`), and a GM places by the
layout it learnt when it started. An agent that lives through an LM restart claims its numbers again
(`WorkerRegistration.first_node`), so the rebuilt LM keeps the layout; one restarted together with its LM would
otherwise take the first free numbers, maybe another agent's, and with unlike nodes the LM's layout would no longer
be the one its GMs place by (they keep it out of their views until they restart; docs/reliability.md). Kept here, the
numbers go with the registration as `kept_first_node`: the LM gives them again when they are free, and does not take
them as a sign that it was itself rebuilt (the agent runs nothing).

The file is `<run id>-<worker id>.nodes` in the agent's user's own folder of the system's temp folder (the folder of
its kept output by default), so it lasts as long as that folder: a container restarted keeps it, one made anew does
not (it then registers as a new agent, as before)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

from megha.common.lifecycle import StartupError
from megha.common.models import WorkerRegistered
from megha.services.worker.isolation import private_folder

log = logging.getLogger("megha.worker")

MAX_BYTES = 4096
"""A kept claim is a few dozen bytes; anything longer is not one (and is not read whole)."""


def default_claim_folder() -> Path:
    """The agent's user's own folder in the system's temp folder, as the kept output's default parent."""
    return Path(tempfile.gettempdir()) / f"megha-{os.geteuid()}"


class NodeClaim:
    """The node numbers this agent (`worker_id` of deployment `run_id`) had at its LM, kept across its restarts."""

    def __init__(self, folder: Path, run_id: str, worker_id: str) -> None:
        self.folder = folder
        self.name = f"{run_id}-{worker_id}.nodes"
        self._warned = False

    @property
    def path(self) -> Path:
        return self.folder / self.name

    def read(self, lm_url: str, nodes: int) -> int | None:
        """The first node number kept for the LM at `lm_url` and as many nodes as this agent offers now; None when
        none is kept (a first start, another LM or another number of nodes, an unreadable file)."""
        try:
            folder = private_folder(self.folder, "the agent's folder of its kept node numbers")
        except StartupError as exc:
            self._warn(str(exc))
            return None
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn(f"{self.path}: {exc.strerror or exc}")
            return None
        finally:
            os.close(folder)
        try:
            kept = json.loads(os.read(fd, MAX_BYTES))
        except ValueError:
            kept = None
        finally:
            os.close(fd)
        if not isinstance(kept, dict) or not _is_index(kept.get("first_node")) or not _is_index(kept.get("nodes")):
            self._warn(f"{self.path} holds no node numbers; it registers as a new agent")
            return None
        if kept.get("lm_url") != lm_url or kept["nodes"] != nodes:
            return None  # kept for another LM, or for another number of nodes: not this agent's numbers now
        return int(kept["first_node"])

    def keep(self, lm_url: str, registered: WorkerRegistered) -> None:
        """Keep the node numbers the LM at `lm_url` just gave this agent (written whole, then renamed into place)."""
        body = json.dumps({"lm_url": lm_url, "first_node": registered.first_node, "nodes": registered.nodes}).encode()
        partial = f".{self.name}.partial-{os.getpid()}"
        folder = -1
        try:
            folder = private_folder(self.folder, "the agent's folder of its kept node numbers")
            fd = os.open(
                partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder
            )
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
            os.replace(partial, self.name, src_dir_fd=folder, dst_dir_fd=folder)
        except (OSError, StartupError) as exc:
            if folder >= 0:
                with contextlib.suppress(OSError):
                    os.unlink(partial, dir_fd=folder)
            self._warn(f"could not keep its node numbers in {self.path}: {getattr(exc, 'strerror', None) or exc}")
        finally:
            if folder >= 0:
                os.close(folder)

    def _warn(self, why: str) -> None:
        """One WARNING per agent life: after a restart together with its LM, it may then get other node numbers."""
        if not self._warned:
            self._warned = True
            log.warning("%s (restarted together with its LM, it may get other node numbers)", why)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31
