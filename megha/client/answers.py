"""The answer of `/healthz` read alike from a GM or an LM, and the job files and bodies `submit` takes. The other
answers are the shared response models of common/models.py (`GMState`, `LMState`, `LMCluster`)."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from megha.common.jsonkeys import KeyTwiceError, unique_keys
from megha.common.models import GMState, JobSubmission, LMCluster, LMState


class Health(BaseModel):
    """`GET /healthz` of a GM or LM (`GMHealth`, `LMHealth`): what both say, the rest kept as it came."""

    model_config = ConfigDict(extra="allow")

    status: str
    ready: bool


class JobFileError(ValueError):
    """A job file that cannot be read, or holds no mapping (the message names the file and the problem)."""


class _JobLoader(yaml.SafeLoader):
    """YAML without aliases (`*name`): a job file needs none, and a few nested ones expand a small file into
    billions of nodes ("billion laughs"), which would hang the reader. A key given twice in one mapping is refused
    (KeyTwiceError naming it and its lines)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "a job file takes no YAML aliases (*name)", self.peek_event().start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:  # the mapping's own keys, before a merge key (<<) brings in others
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key, line = self.construct_object(key_node), key_node.start_mark.line + 1
                if key in lines:
                    raise KeyTwiceError(
                        f"key {str(key)[:40]!r} given twice in one mapping (lines {lines[key]}, {line})"
                    )
                lines[key] = line
        return super().construct_mapping(node, deep)


def read_job_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A job file's mapping, the body of `POST /v1/jobs`: YAML, or JSON for a `.json` file; `-` reads stdin. A FIFO
    or device (whose read could block for ever) is refused, as is a key given twice in one mapping."""
    name = str(path)
    try:
        if name != "-" and not stat.S_ISREG(Path(name).stat().st_mode):
            raise JobFileError(f"{name}: not a regular file (a job file is read from a file, or - for stdin)")
        text = sys.stdin.read() if name == "-" else Path(name).read_text("utf-8-sig")
    except OSError as exc:
        raise JobFileError(f"{name}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise JobFileError(f"{name}: not UTF-8 text") from None
    kind = "JSON" if name.endswith(".json") else "YAML"
    try:
        # A SafeLoader; both refuse a key given twice (KeyTwiceError).
        data = json.loads(text, object_pairs_hook=unique_keys) if kind == "JSON" else yaml.load(text, Loader=_JobLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise JobFileError(f"{name}: not valid {kind}: {exc}".replace("\n", " ")) from None
    except KeyTwiceError as exc:
        raise JobFileError(f"{name}: {exc}") from None
    except ValueError:  # an integer of more digits than Python reads
        raise JobFileError(f"{name}: holds a number too long to read (over 4,300 digits)") from None
    except RecursionError:
        raise JobFileError(f"{name}: {kind} nested too deeply to read") from None
    if not isinstance(data, dict):
        raise JobFileError(f"{name}: a job file holds a mapping with 'tasks' (see examples/job.yaml)")
    return data


def submission(job: JobSubmission | Mapping[str, Any] | str | os.PathLike[str]) -> JobSubmission:
    """The `JobSubmission` of a model, a mapping (the JSON body) or a job file's path; pydantic's ValidationError
    names each bad field, JobFileError a file that cannot be read."""
    if isinstance(job, JobSubmission):
        return job
    data = job if isinstance(job, Mapping) else read_job_file(job)
    return JobSubmission.model_validate_json(json.dumps(data, default=str))


__all__ = ["GMState", "Health", "JobFileError", "LMCluster", "LMState", "read_job_file", "submission"]
