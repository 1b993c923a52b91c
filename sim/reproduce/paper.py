"""The papers' numbers: every figure the text of the two Megha papers states about a result, with where it says so.

"fair" is the Megha paper (../shared/papers/megha-decentralized-global-fair-scheduling.txt), "constraints" the
constraint-aware follow-up (../shared/papers/megha-constraint-aware-federated-scheduling.txt). The papers' figures
are images we do not have: these are the numbers of their captions, prose and tables, read off the text. A claim
without a number in the text (a trend: "increases with ...") is written as a ratio of two of our figures and a bound
on it, so that it can be checked too.

Each claim's `key` names the figure of ours it is compared with (`Result.ours` of the id's runner); our figure may
come in variants (`key (variant)`), each compared with the same claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Relation = Literal["=", "~", "<", ">", ">="]
Unit = Literal["s", "ratio", "share", "load"]
FAIR = "fair"
CONSTRAINTS = "constraints"


@dataclass(frozen=True, slots=True)
class Claim:
    """What a paper says about one of its figures: `key` `relation` `value` (in `unit`), stated at `where`."""

    figure: str  # a catalogue id, e.g. "fair-fig3"
    key: str  # our figure it is compared with
    relation: Relation  # "=" the paper's value, "~" about, "<" / ">" / ">=" a bound
    value: float
    unit: Unit
    where: str  # section, paragraph or table of the paper, and its words where short

    def holds(self, ours: float) -> bool | None:
        """Whether our figure meets a bound; None for a value ("=", "~"), which is compared by ratio only."""
        if ours != ours:  # NaN: nothing measured
            return None
        return {"<": ours < self.value, ">": ours > self.value, ">=": ours >= self.value}.get(self.relation)


def _fair(figure: str, key: str, relation: Relation, value: float, unit: Unit, where: str) -> Claim:
    return Claim(f"fair-{figure}", key, relation, value, unit, f"fair paper, {where}")


def _constraints(figure: str, key: str, relation: Relation, value: float, unit: Unit, where: str) -> Claim:
    return Claim(f"constraints-{figure}", key, relation, value, unit, f"constraint-aware paper, {where}")


_VI_A = "VI-A para 1"
_SEC6_PIGEONC = "section 6, para 3 ('Under PigeonC, the median delays ...')"
_SEC6_MEGHA = "section 6, para 4 ('Under Megha, the median delay was consistently 1.5 ms ...')"
_AT_LEAST_10X = "abstract and section 8: 'reduces the 99th percentile delays ... by at least a factor of 10'"
_FINDING_1 = "section 7, Finding 1 and Table 2: 'median ... at least an order of magnitude lower in Megha'"
_README = "../shared/README.md 'Published reference figures' (the authors' simulator; not in the paper's text)"

CLAIMS: tuple[Claim, ...] = (
    # fair paper, VI-A: Megha vs Sparrow at 10,000 workers (Figs. 3 and 4)
    _fair("fig3", "Megha max allocation time", "<", 1.5, "s", f"{_VI_A}: 'consistently less than 1.5s'"),
    _fair("fig3", "Sparrow max allocation time", "=", 100.0, "s", f"{_VI_A}: 'tens of seconds (max: 100s)'"),
    _fair(
        "fig3",
        "Sparrow / Megha median allocation time",
        "<",
        1.0,
        "ratio",
        f"{_VI_A}: 'The median allocation time of Sparrow is smaller than Megha's'",
    ),
    _fair("fig4", "Megha p99 allocation time", "<", 1.5, "s", f"{_VI_A}: 'consistently less than 1.5s'"),
    _fair(
        "fig4",
        "Megha median allocation time",
        "<",
        0.1,
        "s",
        "abstract and II-C: 'in the order of tens of milliseconds'",
    ),
    _fair(
        "fig4",
        "Sparrow / Megha p99 allocation time",
        "~",
        100.0,
        "ratio",
        "I and VII: 'two orders of magnitude better 99th percentile allocation times than Sparrow'",
    ),
    # fair paper, VI-A: centralized (1 GM, 1 LM) vs Megha (Fig. 6)
    _fair(
        "fig6",
        "centralized / Megha allocation time",
        ">",
        1.0,
        "ratio",
        "VI-A para 2: 'the centralized case reports a very high allocation time when compared to Megha'",
    ),
    # fair paper, VI-B: component delays (Fig. 7)
    _fair("fig7", "communication share", ">", 0.9, "share", "VI-B: 'contributes to over 90% of the delay'"),
    _fair("fig7", "processing share", "<", 0.03, "share", "VI-B: 'contribute to less than 3%'"),
    _fair("fig7", "framework queuing share", "~", 0.07, "share", "VI-B: 'constitutes ~7% of the allocation time'"),
    # fair paper, VI-C and VI-D: data-centre size, numbers of GMs and LMs (Figs. 8 and 9)
    _fair(
        "fig8",
        "allocation time, largest / smallest data centre",
        ">",
        1.0,
        "ratio",
        "VI-C: 'allocation time increases with an increase in the number of workers'",
    ),
    _fair(
        "fig9",
        "allocation time, 1 GM / most GMs up to the LMs",
        ">",
        1.0,
        "ratio",
        "VI-D: 'Increasing the number of GMs ... decreasing the Framework_Queueing_Delay'",
    ),
    _fair(
        "fig9",
        "allocation time, 1 LM / most LMs",
        ">",
        1.0,
        "ratio",
        "VI-D: 'Increasing the number of LMs increases the total number of GM requests that can be processed'",
    ),
    _fair(
        "fig9",
        "allocation time, more GMs than LMs / as many GMs as LMs",
        ">",
        1.0,
        "ratio",
        "VI-D: 'when the number of GMs exceeds the number of LMs, ... a slight increase'",
    ),
    # fair paper, VI-E: fairness (Figs. 10 and 11)
    _fair(
        "fig10",
        "allocation time, smallest / largest data centre",
        ">",
        1.0,
        "ratio",
        "VI-E: 'The allocation time is seen to increase with a decrease in the cluster size'",
    ),
    *(
        _fair(
            "fig11",
            f"{what}, smallest / largest data centre",
            ">",
            1.0,
            "ratio",
            "VI-E: 'The number of preemptions, preemption attempts, and repartitions also follow the same trend'",
        )
        for what in ("preemptions", "preemption attempts", "repartitions")
    ),
    # fair paper, VI-F: the prototype on 128 Linode nodes (Fig. 12)
    _fair(
        "fig12",
        "prototype / simulator allocation time",
        ">",
        1.0,
        "ratio",
        "VI-F: 'The allocation times recorded in the prototype were found to be higher than those recorded during the "
        "simulation'",
    ),
    _fair("fig12", "median execution delay, google_19", "=", 3.32, "s", "VI-F: 'median execution delays ... 3.32 s'"),
    _fair("fig12", "median execution delay, alibaba", "=", 2.15, "s", "VI-F: '... and 2.15s for alibaba'"),
    _fair(
        "fig12",
        "heavier / lighter workload median execution delay",
        ">",
        1.0,
        "ratio",
        "VI-F: 'The load from the google_19 workload is higher, causing greater resource contention and interference "
        "thereby leading to larger delays'",
    ),
    # constraint-aware paper, Figure 5: conflicts per second (no number in the text; a trend)
    *(
        _constraints(
            "fig5",
            f"{high} / {low} mean conflicts per second",
            ">",
            1.0,
            "ratio",
            "section 7, Finding 1: 'as the per-constraint load increases, leading to a rise in conflicts'",
        )
        for low, high in (("syn_250", "syn_500"), ("syn_500", "syn_1000"))
    ),
    # constraint-aware paper, Table 1: load of the workloads
    *(
        _constraints("table1", f"{workload} {stat} load", "=", value, "load", "Table 1")
        for workload, values in (
            ("Yahoo", (0.30, 0.33, 1.08)),
            ("Google", (0.0032, 0.05, 0.77)),
            ("syn_250", (0.025, 0.025, 0.025)),
            ("syn_500", (0.05, 0.05, 0.05)),
            ("syn_1000", (0.1, 0.1, 0.1)),
        )
        for stat, value in zip(("median", "average", "p99"), values)
    ),
    # constraint-aware paper, section 6: JRT delay of the synthetic workloads (Fig. 6)
    *(
        _constraints("fig6", f"PigeonC {matching} {workload} JRT delay p50", "=", value, "s", _SEC6_PIGEONC)
        for workload, matching, value in (
            ("syn_250", "random", 1.003),
            ("syn_250", "min-constraints", 1.002),
            ("syn_500", "random", 507.74),
            ("syn_500", "min-constraints", 520.60),
            ("syn_1000", "random", 1416.88),
            ("syn_1000", "min-constraints", 1449.3),
        )
    ),
    *(
        _constraints("fig6", f"Megha {matching} {workload} JRT delay p50", "=", value, "s", _SEC6_MEGHA)
        for workload, matching, value in (
            ("syn_250", "random", 0.0015),
            ("syn_250", "min-constraints", 0.0015),
            ("syn_500", "random", 0.0015),
            ("syn_500", "min-constraints", 0.0015),
            ("syn_1000", "random", 0.67),
            ("syn_1000", "min-constraints", 0.33),
        )
    ),
    *(
        _constraints("fig6", f"PigeonC / Megha {workload} JRT delay p99", ">=", 10.0, "ratio", _AT_LEAST_10X)
        for workload in ("syn_250", "syn_500", "syn_1000")
    ),
    *(
        _constraints("fig6", f"PigeonC / Megha {workload} JRT delay p50", ">=", 10.0, "ratio", _FINDING_1)
        for workload in ("syn_250", "syn_500", "syn_1000")
    ),
    *(
        _constraints(
            "fig6", f"Megha {workload} JRT delay p99 difference, random vs min-constraints", "<", 1.0, "s", _SEC6_MEGHA
        )
        for workload in ("syn_250", "syn_500", "syn_1000")
    ),
    _constraints(
        "fig6",
        "PigeonC syn_500 JRT delay p99, random / min-constraints",
        "=",
        1 / 1.03,
        "ratio",
        f"{_SEC6_PIGEONC}: 'the Random approach achieved ... reductions by factors of ... 1.03'",
    ),
    _constraints(
        "fig6",
        "PigeonC syn_1000 JRT delay p99, random / min-constraints",
        "=",
        1.006,
        "ratio",
        f"{_SEC6_PIGEONC}: 'the Minimum Constraints approach slightly outperformed ... factors of 1.006'",
    ),
    _constraints(
        "fig6",
        "PigeonC syn_250 JRT delay p99, random / min-constraints",
        "=",
        1.08,
        "ratio",
        f"{_SEC6_PIGEONC}: 'factors of 1.006 and 1.08' (its next sentence says Random was 8% better instead)",
    ),
    *(
        Claim(
            "constraints-fig6",
            f"{scheduler} random syn_250, first 200 jobs, JRT delay {stat}",
            "=",
            value,
            "s",
            _README,
        )
        for scheduler, values in (("Megha", (0.0015, 1.003, 4.95)), ("PigeonC", (1.0025, 11.04, 11.06)))
        for stat, value in zip(("p50", "p99", "max"), values)
    ),
    # constraint-aware paper, section 6 and 7: the Yahoo workload (Fig. 7)
    _constraints("fig7", "PigeonC random Yahoo JRT delay p50", "=", 1281.3, "s", _SEC6_PIGEONC),
    _constraints("fig7", "PigeonC min-constraints Yahoo JRT delay p50", "=", 1161.86, "s", _SEC6_PIGEONC),
    _constraints("fig7", "Megha random Yahoo JRT delay p50", "=", 0.0015, "s", _SEC6_MEGHA),
    _constraints("fig7", "Megha min-constraints Yahoo JRT delay p50", "=", 0.0015, "s", _SEC6_MEGHA),
    _constraints(
        "fig7",
        "Megha Yahoo JRT delay p99, min-constraints / random",
        "=",
        1.29,
        "ratio",
        "section 7, Finding 4, Table 2 and section 8: '1.29 times higher ... under the Minimum Constraints approach'",
    ),
    _constraints(
        "fig7",
        "PigeonC Yahoo JRT delay p99, random / min-constraints",
        "=",
        1.05,
        "ratio",
        f"{_SEC6_PIGEONC}: 'reduced the 99th percentile tail latency by approximately 1.05x'",
    ),
    _constraints(
        "fig7",
        "PigeonC Yahoo JRT delay p99, random / min-constraints",
        "=",
        1.1,
        "ratio",
        "section 7, Finding 5: 'improved the 99th percentile delays by a factor of 1.1' (section 6 says 1.05)",
    ),
    _constraints("fig7", "PigeonC / Megha Yahoo JRT delay p99", ">=", 10.0, "ratio", _AT_LEAST_10X),
    _constraints("fig7", "PigeonC / Megha Yahoo JRT delay p50", ">=", 10.0, "ratio", _FINDING_1),
    _constraints(
        "fig7",
        "Megha Yahoo JRT delay max",
        "<",
        1.5e4,
        "s",
        "section 7, Finding 1: 'Megha maintained job response time delays below 1.5 x 10^4 s'",
    ),
    # constraint-aware paper, section 6 and 7: the Google workload (Fig. 8)
    _constraints("fig8", "PigeonC random Google JRT delay p50", "~", 0.0015, "s", _SEC6_PIGEONC),
    _constraints("fig8", "PigeonC min-constraints Google JRT delay p50", "~", 0.0015, "s", _SEC6_PIGEONC),
    _constraints("fig8", "Megha random Google JRT delay p50", "=", 0.0015, "s", _SEC6_MEGHA),
    _constraints("fig8", "Megha min-constraints Google JRT delay p50", "=", 0.0015, "s", _SEC6_MEGHA),
    _constraints(
        "fig8",
        "PigeonC Google JRT delay p99, random / min-constraints",
        "=",
        1 / 1.002,
        "ratio",
        f"{_SEC6_PIGEONC}: 'the Random approach achieved a marginal improvement ... factors of 1.002'",
    ),
    _constraints(
        "fig8",
        "Megha Google JRT delay p99, min-constraints / random",
        "=",
        0.998,
        "ratio",
        f"{_SEC6_MEGHA}: 'a minimal 0.2% reduction for the Google workload under the Minimum Constraints approach'",
    ),
    _constraints("fig8", "PigeonC / Megha Google JRT delay p99", ">=", 10.0, "ratio", _AT_LEAST_10X),
    _constraints(
        "fig8",
        "Megha Google JRT delay max",
        "<",
        1.5e4,
        "s",
        "section 7, Finding 1: 'Megha maintained job response time delays below 1.5 x 10^4 s'",
    ),
    # constraint-aware paper, section 6 and Finding 3: utilization (Fig. 9)
    *(
        _constraints(
            "fig9",
            f"PigeonC / Megha mean utilization, {workload}",
            "<",
            1.0,
            "ratio",
            "section 7, Finding 3: 'Across all workloads, Megha recorded a higher average utilization than PigeonC'",
        )
        for workload in ("syn_250", "syn_500", "syn_1000", "Yahoo", "Google")
    ),
)


def claims(figure: str) -> list[Claim]:
    """The claims about one figure, in the order above."""
    return [c for c in CLAIMS if c.figure == figure]
