"""The chaos matrix in CI: one trial of every fault (`megha chaos`), each through real processes and a RabbitMQ
node of its own. Target in every trial: nothing lost, nothing counted twice, every node usable again within
2 x (worker timeout + delta interval) of the fault clearing."""

from __future__ import annotations

from pathlib import Path

import pytest

from megha.deploy.chaos import FAULTS, ChaosConfig, run_trial

from servicekit import needs_rabbitmq

pytestmark = needs_rabbitmq


@pytest.mark.parametrize("name", list(FAULTS))
def test_one_trial_of_each_fault_loses_nothing_and_recovers_in_time(name: str, tmp_path: Path) -> None:
    config = ChaosConfig(out=tmp_path)
    trial = run_trial(config, FAULTS[name], 1, print)
    assert trial.accepted == 450
    assert (trial.lost, trial.duplicated, trial.failed_with_reason) == (0, 0, 0), trial
    assert trial.finished_once == trial.accepted
    assert trial.recovery_seconds <= config.recovery_target, trial
