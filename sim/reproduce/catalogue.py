"""Every result figure and table of the two Megha papers, by id: the paper's caption in a few words, the set-up we
run for it and how that differs from the paper's.

Ids: `fair-fig3` .. `fair-fig12` (the Megha paper, "fair": ../shared/papers/megha-decentralized-global-fair-
scheduling.txt) and `constraints-fig2` .. `constraints-fig10`, `constraints-table1` (the constraint-aware paper,
"constraints": ../shared/papers/megha-constraint-aware-federated-scheduling.txt). An entry's `runner` names the
function of this package that runs it ("module.function"), imported only when the id runs.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPERS = {
    "fair": "Megha: Decentralized Global Fair Scheduling for Federated Clusters (Thiyyakat, Kalambur, Sitaram)",
    "constraints": "Constraint-Aware Federated Scheduling for Data Center Workloads (IoT 2023, 4(4), 534-557)",
}


@dataclass(frozen=True, slots=True)
class Entry:
    """One figure or table of a paper and how we reproduce it."""

    id: str
    label: str  # "Fig. 3", "Table 1"
    caption: str  # the paper's caption, in a few words
    setup: str  # the set-up we run at full scale
    quick: str  # what `--quick` cuts from it
    differs: str = ""  # how our set-up or data differ from the paper's ("" when they do not)
    runner: str = ""  # "module.function" of this package
    real_services: bool = False  # runs the real GM, LM and agent processes: needs RabbitMQ (MEGHA_AMQP_URL)

    @property
    def paper(self) -> str:
        return self.id.split("-", 1)[0]

    @property
    def status(self) -> str:
        return f"yes, with differences: {self.differs}" if self.differs else "yes"


_NO_CLOUDERA = (
    "the paper's Cloudera sample (10,173 tasks) is not shared; the stand-in is the first 222 jobs (10,186 tasks) of "
    "the Yahoo trace, also a SWIM MapReduce workload of Chen et al.; tasks hold a whole worker (the traces carry no "
    "sizes); the paper's Sparrow is its own simulator with a measured launch delay, ours runs on our event loop"
)
_SPARROW_SETUP = (
    "Megha (5 GMs x 5 LMs, calibrated decision costs) and Sparrow (10 schedulers, 2 probes per task, late binding, "
    "deciding for free: the paper's Megha simulator ran the prototype's code, its Sparrow simulator counted network "
    "delays only) on 10,000 generated workers, no placement constraints, 10 s heartbeats (fair V), 0.5 ms per hop; "
    "the sample with the trace's own arrivals, and re-timed to 90% load (Poisson arrivals, 'different load "
    "conditions')"
)
_FAIRNESS_SETUP = (
    "4 user queues with shares 10%, 25%, 15%, 50% on GMs 1, 2, 2, 3 (fair VI-E), 2 LMs x 3 GMs of 198, 498 and 1,500 "
    "workers, share policy, 10 s heartbeats, calibrated decision costs, a task that fits nowhere re-inserted at the "
    "back of its queue (fair IV-B5, `--unplaceable requeue-back`); the first 67 jobs of the Google sub-trace "
    "(5,821 tasks), one task per worker"
)
_FAIRNESS_DIFFERS = (
    "google_19 (4,550 tasks) is not shared: the stand-in is the Google sub-trace's first jobs holding at least "
    "4,550 tasks; a task holds a whole worker (with the prototype's scaled-down requests, 200 workers are never "
    "contended by this sample); no placement constraints (the paper's google_19 had them; 198 workers lack the "
    "rarer ones, so their jobs would be rejected); a task that fits nowhere goes to the back of its queue as in the "
    "paper (`--unplaceable requeue-back`), not `megha replay`'s default of parking it until a node it fits frees up"
)
_VS_PIGEONC = (
    "Megha (5 GMs x 5 LMs, 1 s heartbeats) and PigeonC (10 distributors x 100 masters, FQW 20), both deciding for "
    "free as in the authors' trace-driven simulator (constraint-aware section 5), in slot mode, "
    "Sharma et al. constraints, 0.5 ms per hop, Random and Minimum-Constraints matching, seeds 0-2; PigeonC both "
    "with the authors' simulator's tally of constraint sets (`pigeonc-published`, which produced the paper's "
    "figures) and with the paper's rule (`pigeonc`)"
)
_YAHOO_DIFFERS = (
    "the shared Yahoo trace is the sub-trace published with the authors' simulator (2,910 jobs, 122,878 tasks); "
    "the paper counts 24,262 jobs and 968,335 tasks"
)
_SYN = "syn_250, syn_500 and syn_1000 (all 2,000 jobs) on the published 10,000-node reference cluster"
_LOAD = (
    "computed from the trace and the data centre, no scheduler: each task needs its worker from its arrival for its "
    "duration; sampled at the middle of every second from the first arrival to the last end"
)
_PER_CONSTRAINT = (
    f"{_LOAD}; per constraint id: tasks needing it / workers having it, average, median, p95 and p99 over the "
    "seconds; task constraints drawn as in a replay (Sharma et al., seeds 0-2)"
)
_CONFLICTS = (
    "the paper counts 'conflicts, where multiple tasks wait for a worker node' per second under two stated "
    "assumptions (tasks switch to another worker when needed; no delay carries into later seconds) but gives no "
    "rule; ours: each task, at its arrival, picks a worker uniformly among those satisfying its constraints, and a "
    "pick of a worker another task holds is one conflict (the task then switches to a free one)"
)

ENTRIES: tuple[Entry, ...] = (
    Entry(
        "fair-fig3",
        "Fig. 3",
        "distribution of allocation times, Megha vs Sparrow, 10,000 workers",
        _SPARROW_SETUP,
        "one seed",
        _NO_CLOUDERA,
        runner="fair.sparrow_distribution",
    ),
    Entry(
        "fair-fig4",
        "Fig. 4",
        "median, mean, p90, p99 and p99.99 allocation time, Megha vs Sparrow",
        f"the runs of fair-fig3: {_SPARROW_SETUP}",
        "one seed",
        _NO_CLOUDERA,
        runner="fair.sparrow_statistics",
    ),
    Entry(
        "fair-fig5",
        "Fig. 5",
        "worker slots the workload sample requires over time",
        "the sample of fair-fig3, with the trace's arrivals and re-timed to 90% load (seed 0): slots busy if every "
        "task started on arrival, against the 10,000 workers",
        "nothing (no replay)",
        _NO_CLOUDERA,
        runner="load.sample_slots",
    ),
    Entry(
        "fair-fig6",
        "Fig. 6",
        "allocation time at 10,000 and 20,000 workers, centralized vs decentralized",
        "Megha (5 GMs x 5 LMs) and the centralized configuration (1 GM, 1 LM, the same workers) on 10,000 and 20,000 "
        "generated workers, Sharma et al. constraints, 10 s heartbeats, calibrated decision costs "
        "(`--decision-costs calibrated`: the single GM pays for the whole data centre's state); the Google "
        "sub-trace's first 104 jobs (9,912 tasks), one task per worker",
        "one seed",
        "the alibaba sample (8,000 tasks) is not shared: the stand-in is the Google sub-trace's first jobs holding at "
        "least 8,000 tasks; deciding costs this code's calibrated times, not the prototype's",
        runner="fair.centralized",
    ),
    Entry(
        "fair-fig7",
        "Fig. 7",
        "contributions of the component delays to allocation time (medians)",
        "Megha's runs of fair-fig3 (trace arrivals, calibrated decision costs): the median of framework queuing, "
        "processing, communication and worker queuing, and each one's share of their sum",
        "one seed",
        f"{_NO_CLOUDERA}; processing is this code's calibrated cost (docs/decision-time.md)",
        runner="fair.components",
    ),
    Entry(
        "fair-fig8",
        "Fig. 8",
        "allocation time against data-centre size, 10 GMs x 10 LMs",
        "Poisson arrivals of 100-task jobs of 1 s tasks offering 80% of the workers for 10 s (as "
        "sim/experiments/scale.py), 1,000 to 50,000 generated workers under 10 GMs x 10 LMs, Sharma et al. "
        "constraints, 10 s heartbeats, calibrated decision costs",
        "1,000 to 10,000 workers, 5 s of arrivals, one seed",
        "the paper's workload for this figure is not named (alibaba or google_19, neither shared): ours offers the "
        "same load to every size",
        runner="fair.cluster_size",
    ),
    Entry(
        "fair-fig9",
        "Fig. 9",
        "allocation time for different numbers of GMs and LMs, 30,000 workers",
        "Poisson arrivals of 2,000 jobs/s of 100 tasks (more than one GM decides under the calibrated model: 176 us + "
        "100 x 4.97 us a job), tasks of 0.09 s (60% of the workers) for 2 s, on 30,000 generated workers: 1, 2, 5, 10, "
        "20 GMs under 10 LMs and 1, 2, 5, 10, 20 LMs under 10 GMs; Sharma et al. constraints, 10 s heartbeats, "
        "calibrated decision costs",
        "10,000 workers, 0.03 s tasks (the same 2,000 jobs/s at 60% load) for 0.3 s, 1, 2, 5, 10 and 20 GMs and 1, 2, "
        "5 and 10 LMs, one seed",
        "the alibaba trace is not shared; ours is a stand-in whose job rate makes the number of GMs and LMs matter "
        "under this code's decision costs",
        runner="fair.masters",
    ),
    Entry(
        "fair-fig10",
        "Fig. 10",
        "allocation time with fairness at 200, 500 and 1,500 workers",
        _FAIRNESS_SETUP,
        "one seed",
        _FAIRNESS_DIFFERS,
        runner="fair.fairness_allocation",
    ),
    Entry(
        "fair-fig11",
        "Fig. 11",
        "preemptions, preemption attempts and repartitions at each data-centre size",
        f"the runs of fair-fig10: {_FAIRNESS_SETUP}",
        "one seed",
        _FAIRNESS_DIFFERS,
        runner="fair.fairness_counts",
    ),
    Entry(
        "fair-fig12",
        "Fig. 12",
        "allocation time of the prototype on 128 cloud nodes (google_19, alibaba)",
        "the real services on this machine: 3 GMs, 3 LMs and 9 worker agents as separate processes talking REST and "
        "RabbitMQ (`megha local`'s deployment), one node an agent, each node a ninth of the machine's 2 cores "
        "(222 millicores) and 454 MB (the paper's 4 GB per 2 vCPUs), each task burning its CPU and touching its memory "
        "in a process of its own; and the simulator (calibrated decision costs) on the same data centre and task set; "
        "10 s heartbeats; the Google sub-trace's first 20 jobs (434 tasks, the heavier workload, in google_19's place) "
        "and first 11 jobs (166 tasks, the lighter, in alibaba's), its own arrivals, time scaled 2,000x down "
        "(tasks of 3-43 s), requests in scaled mode divided by 200 (CPU and memory), no placement constraints; "
        "the prototype's execution delay per task as its worker measures it",
        "time scaled 4,000x down (tasks half as long), one seed",
        "one 2-core machine, not 128 VMs of 2 vCPUs: every GM, LM, agent and task, the broker and the load generator "
        "share its 2 cores, so a task interferes with the tasks of every node and with the services, where the "
        "paper's interfered with those of its own node; 9 nodes, not 120; requests divided by 200, not by 400 (CPU) "
        "and 50 (memory), so that the data centre holds about 100 tasks, each a process, and CPU binds before memory; "
        "google_19 and alibaba are not shared: both stand-ins are prefixes of the Google sub-trace (every prefix of "
        "the Yahoo trace longer than one job asks for over 5 times the data centre's CPU, so neither load could come "
        "from it); no placement constraints (9 nodes lack the rarer ones)",
        runner="prototype.prototype_allocation",
        real_services=True,
    ),
    Entry(
        "constraints-fig2",
        "Figure 2",
        "per-constraint load of the synthetic workloads",
        f"{_SYN}; {_PER_CONSTRAINT}",
        "one seed",
        runner="load.per_constraint_synthetic",
    ),
    Entry(
        "constraints-fig3",
        "Figure 3",
        "per-constraint load of the Yahoo workload",
        f"the Yahoo trace on the reference cluster; {_PER_CONSTRAINT}",
        "one seed",
        _YAHOO_DIFFERS,
        runner="load.per_constraint_yahoo",
    ),
    Entry(
        "constraints-fig4",
        "Figure 4",
        "per-constraint load of the Google workload",
        f"the Google sub-trace on 20,000 generated workers (5 x 5 x 800, machine constraints drawn per seed); "
        f"{_PER_CONSTRAINT}",
        "one seed",
        runner="load.per_constraint_google",
    ),
    Entry(
        "constraints-fig5",
        "Figure 5",
        "scheduling conflicts per second of the synthetic workloads",
        f"{_SYN}; computed from the trace and the data centre, no scheduler: each task holds a worker from its "
        "arrival for its duration, and conflicts are counted per second of arrival; task constraints drawn as in a "
        "replay (Sharma et al., seeds 0-2)",
        "the first 200 jobs of each trace, one seed",
        _CONFLICTS,
        runner="load.conflicts",
    ),
    Entry(
        "constraints-fig6",
        "Figure 6",
        "CDF of JRT delay, synthetic workloads, Megha vs PigeonC, Random and Minimum-Constraints",
        f"{_SYN}; {_VS_PIGEONC}",
        "the first 200 jobs of each trace (the prefix of the published reference in ../shared/README.md), one seed",
        runner="constraints.synthetic_delays",
    ),
    Entry(
        "constraints-fig7",
        "Figure 7",
        "CDF of JRT delay, Yahoo workload",
        f"the Yahoo trace on the reference cluster; {_VS_PIGEONC}",
        "one seed",
        _YAHOO_DIFFERS,
        runner="constraints.yahoo_delays",
    ),
    Entry(
        "constraints-fig8",
        "Figure 8",
        "CDF of JRT delay, Google workload",
        f"the Google sub-trace (10,000 jobs) on 20,000 generated workers (5 x 5 x 800); {_VS_PIGEONC}",
        "the first 3,000 jobs, one seed",
        runner="constraints.google_delays",
    ),
    Entry(
        "constraints-fig9",
        "Figure 9",
        "PigeonC's mean utilization normalized to Megha's",
        "the runs of constraints-fig6, -fig7 and -fig8: mean utilization (busy share of the workers from the first "
        "start to the last finish) averaged over matchings and seeds, PigeonC's over Megha's",
        "the quick runs of constraints-fig6, -fig7 and -fig8 with Random matching only",
        runner="constraints.utilization_ratio",
    ),
    Entry(
        "constraints-fig10",
        "Figure 10",
        "CDF of utilization of the synthetic workloads, Megha vs PigeonC",
        "the runs of constraints-fig6 with seed 0 and Random matching: the utilization of each step of the busy span",
        "the quick runs of constraints-fig6",
        runner="constraints.utilization_cdf",
    ),
    Entry(
        "constraints-table1",
        "Table 1",
        "median, average and p99 load of the workloads",
        f"Yahoo and the synthetic traces on 10,000 workers, Google on 20,000; {_LOAD}; load = workers needed / workers",
        "nothing (no replay, no seeds)",
        _YAHOO_DIFFERS,
        runner="load.workload_load",
    ),
)

BY_ID: dict[str, Entry] = {entry.id: entry for entry in ENTRIES}


def entry(figure: str) -> Entry:
    """The entry of `figure`; a KeyError naming the known ids for any other."""
    try:
        return BY_ID[figure]
    except KeyError:
        raise KeyError(f"unknown id {figure!r}; known ids: {', '.join(BY_ID)}") from None
