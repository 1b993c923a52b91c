"""Field types and limits every wire model shares, and `WireModel`, the base that makes them strict.

On the wire resources travel as lists of ints aligned to the data centre's resource names
(`ClusterSpec.resource_names`); placement constraints as lists of ids 0..20 without duplicates (the core packs them
into a bit mask); times as floats in seconds (unix seconds in the services, simulated seconds under the simulator).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from megha.common.auth import USER_NAME
from megha.common.core.constraints import NUM_CONSTRAINTS, constraint_mask, iter_bits

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body a service accepts (413 above it). A maximal `JobSubmission` of burn tasks (10,000 tasks,
every constraint, 64-character users) is about 2.3 MB of compact JSON, 3.5 MB indented."""

MAX_TASKS_PER_JOB = 10_000
MAX_NODES_PER_WORKER = 100_000
"""An agent in simulated-execution mode may stand for many nodes; this bounds one registration."""


def _unique(ids: list[int]) -> list[int]:
    if len(set(ids)) != len(ids):
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise ValueError(f"duplicate constraint ids {duplicates}")
    return ids


def distinct(drivers: list[str]) -> list[str]:
    if len(set(drivers)) != len(drivers):
        raise ValueError(f"drivers {drivers} name one twice")
    return drivers


def ids_of(mask: int) -> list[int]:
    """The constraint ids of a core constraint mask, lowest first."""
    return list(iter_bits(mask)) if mask else []


def mask_of(ids: list[int]) -> int:
    """The core constraint mask of a list of constraint ids."""
    return constraint_mask(ids) if ids else 0


# Field types shared by the models. Integers and strings are strict through `WireModel.model_config`.
Index = Annotated[int, Field(ge=0)]
"""A GM, LM or node number, a sequence number or a version."""
Count = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
"""A task, job or worker id as the services generate them."""
User = Annotated[str, Field(min_length=1, max_length=64)]
UserName = Annotated[str, Field(pattern=USER_NAME.pattern)]
"""A user a submission names: 1-64 letters, digits or _ . @ - (as API tokens' users are); user names go into job
ids (`scoped_job_id`), which travel in URLs and as task ids."""
JOB_SCOPE = "~"
"""Between the user and the name of a job id a user chose, `<user>~<name>`, and before the GM-made id that makes it
unique, `<user>~<name>~<gm-made id>` (none of them holds it)."""
JobId = Annotated[str, Field(pattern=r"^([A-Za-z0-9_.@-]{1,64}~)?[A-Za-z0-9_.-]{1,64}$")]
"""A job id a client may choose: a name of 1-64 letters, digits or _ . -, or the name in a user's scope,
`<user>~<name>` (`scoped_job_id`); the GM makes the job's id unique, `<user>~<name>~<gm-made id>`. Task ids are
f"{job_id}.{i}"."""
JobRef = Annotated[str, Field(pattern=r"^([A-Za-z0-9_.@-]{1,64}~){0,2}[A-Za-z0-9_.-]{1,64}$")]
"""A job a submission names as a parent (`depends_on`): a job id as a GM answered it (`g<gm>-...`,
`<user>~<name>~<gm-made id>`), or a name the caller chose (`<name>`, `<user>~<name>`)."""
MAX_DEPENDENCIES = 100
"""The most parents a job may name in `depends_on`."""
ARRAY_INDEX = "MEGHA_ARRAY_INDEX"
"""The environment variable holding an array job's task index (0, 1, ...)."""
MAX_ARRAY_RUN_CHARS = 4 * MAX_BODY_BYTES
"""The most characters of runs (commands, env, images, workdirs) an array job may expand to, all tasks together:
each task holds its own copy in the GM, the LM and the agent, so an array of 2,000 tasks of a 64 KB template,
sent in 64 KB, would hold hundreds of MB of every service's memory (a job sent whole is held to MAX_BODY_BYTES)."""
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Timestamp = Annotated[float, Field(allow_inf_nan=False)]
ConstraintId = Annotated[int, Field(ge=0, le=NUM_CONSTRAINTS - 1)]
ConstraintIds = Annotated[list[ConstraintId], Field(max_length=NUM_CONSTRAINTS), AfterValidator(_unique)]
MAX_AMOUNT = 2**53 - 1
"""Largest amount of a resource a task may ask for: the largest integer every JSON reader keeps exact (a larger one
fits no node anyway, and would be echoed in full in the refusal)."""
Request = Annotated[int, Field(gt=0, le=MAX_AMOUNT)]
"""A task's request of one resource (millicores, MB): at least 1."""
Amounts = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
"""A resource vector aligned to the data centre's resource names."""
ResourceName = Annotated[str, Field(min_length=1, max_length=64)]
Driver = Literal["burn", "exec", "container"]
"""A task driver (`megha.common.core.task.DRIVERS`)."""

MAX_ARGS = 256
MAX_ARG_CHARS = 16_384
MAX_ENV = 128
MAX_RUN_CHARS = 65_536
"""Most characters of one task's command, environment and working directory together: one such task stays far
under MAX_BODY_BYTES in a launch body (a batch of many is split: `split_json`)."""
Arg = Annotated[str, Field(max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")]
"""One argument or environment value: any text without NUL (which an exec cannot pass)."""
Argv = Annotated[list[Arg], Field(max_length=MAX_ARGS)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
Env = Annotated[dict[EnvName, Arg], Field(max_length=MAX_ENV)]
Image = Annotated[
    str,
    Field(
        max_length=255,
        pattern=r"^(|([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
        r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?)$",
    ),
]
"""A Docker image reference (`name[:tag][@digest]`, an optional registry host first), or "" for none."""
Workdir = Annotated[str, Field(max_length=4096, pattern=r"^(|/[^\x00]*)$")]
"""An absolute path, or "" for the driver's default."""


def field_error(field: str, value: object, message: str) -> ValidationError:
    """A validation error at `field` of the model being validated (a model validator cannot name one otherwise;
    pydantic prefixes the path of the model, say "tasks.3")."""
    error = PydanticCustomError("driver_mismatch", message)
    return ValidationError.from_exception_data("driver", [InitErrorDetails(type=error, loc=(field,), input=value)])


def check_run(driver: str, command: list[str], image: str, env: dict[str, str], workdir: str) -> None:
    """Raise a ValidationError naming the field that does not go with `driver`."""
    if driver == "burn":
        for field, value in (("command", command), ("image", image), ("env", env), ("workdir", workdir)):
            if value:
                raise field_error(field, value, f"{field} is for the exec and container drivers, not burn")
        return
    if driver == "exec":
        if not command:
            raise field_error("command", command, "the exec driver needs a command (argv, at least the program)")
        if not command[0]:
            raise field_error("command", command, "the program (command[0]) is empty")
        if image:
            raise field_error("image", image, "image is for the container driver, not exec")
    elif not image:
        raise field_error("image", image, "the container driver needs an image")
    argv_size = sum(map(len, command))
    env_size = sum(len(k) + len(v) for k, v in env.items())
    if argv_size + env_size + len(workdir) > MAX_RUN_CHARS:
        field, value = ("env", env) if env_size > argv_size else ("command", command)
        message = (
            f"command, env and workdir hold {argv_size + env_size + len(workdir)} characters; at most {MAX_RUN_CHARS}"
        )
        raise field_error(field, value, message)


class WireModel(BaseModel):
    """Base of every wire model: unknown fields are errors and types are strict."""

    model_config = ConfigDict(extra="forbid", strict=True)
