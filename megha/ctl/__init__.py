"""`megha job|queues|nodes|top`: operate a running deployment through its GMs' and LMs' REST routes, with the typed
answers of megha.client; and `megha reproduce` (reproduce.py): the papers' figures on the simulator.

Tables for people (rich), `--json` for scripts: the API's JSON as the services sent it (commands that ask several
services wrap each answer, unchanged, with the URL it came from). docs/cli.md lists the commands. The commands live
by group: megha/ctl/jobs.py (`job`), cluster.py (`queues`, `nodes`), top.py; what they share in common.py.

Exit status: 0 done; 1 a GM or LM refused the request (its `ErrorBody` in one line); 2 bad usage or a bad job file;
3 a GM or LM could not be reached (its URL and the reason in one line); 4 `job watch`: the job ended with a task
not finished.
"""

from __future__ import annotations

import click

from megha.ctl.cluster import nodes, queues
from megha.ctl.jobs import job
from megha.ctl.reproduce import reproduce
from megha.ctl.top import top


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="megha", prog_name="megha", message="%(prog)s %(version)s")
def cli() -> None:
    """Operate a running Megha deployment through its GMs' and LMs' REST APIs.

    Exit status: 0 done; 1 a GM or LM refused the request; 2 bad usage or a bad job file; 3 a GM or LM could not
    be reached; 4 `job watch`: the job ended with a task not finished.
    """


for command in (job, queues, nodes, top, reproduce):
    cli.add_command(command)
