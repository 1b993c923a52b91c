"""The chaos matrix's container backend in CI (`megha chaos --backend containers`): the services as containers
of the images deploy/images/build.sh makes, on a Docker network of the trial's own, and faults made with the docker
CLI. CI runs one trial of two faults, the ones only containers can make: a GM's container killed and started again
(its journal must survive in the container's filesystem) and a GM cut off the network (`docker network disconnect`);
`megha chaos --backend containers` runs them all (docs/reliability.md). Targets as for the process backend: nothing
lost, nothing counted twice, every node usable again within 2 x (worker timeout + delta interval) of the fault
clearing; and nothing of the deployment left in Docker afterwards, also when it failed to start."""

from __future__ import annotations

from pathlib import Path

import pytest

from megha.deploy import chaos
from megha.deploy.containers import ContainerDeployment

from dockerkit import build_images

pytestmark = pytest.mark.docker

CI_FAULTS = ["gm-kill"]
"""The container backend's own parts (a network per trial, `docker kill`, nothing left behind) in CI; every other
fault, `gm-partition` (docker network disconnect) among them, runs in `megha chaos --backend containers` and the
matrices of docs/reliability.md (CI's process faults cover the same recovery paths)."""


class _Recorded(ContainerDeployment):
    """A deployment that keeps itself in `made`, so a test can ask Docker what is left of it."""

    made: list[ContainerDeployment] = []

    def __enter__(self) -> ContainerDeployment:
        _Recorded.made.append(self)
        return super().__enter__()


def _nothing_left(deployment: ContainerDeployment) -> None:
    assert deployment.leftovers() == {"containers": [], "networks": []}


@pytest.mark.parametrize("name", CI_FAULTS)
def test_one_trial_loses_nothing_recovers_in_time_and_leaves_nothing(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_images()
    monkeypatch.setattr(_Recorded, "made", [])
    monkeypatch.setattr(chaos, "ContainerDeployment", _Recorded)
    config = chaos.ChaosConfig(backend="containers", out=tmp_path)
    trial = chaos.run_trial(config, name, 1, print)
    assert trial.accepted == 450
    assert (trial.lost, trial.duplicated, trial.failed_with_reason) == (0, 0, 0), trial
    assert trial.finished_once == trial.accepted
    assert trial.recovery_seconds <= config.recovery_target, trial
    (deployment,) = _Recorded.made
    _nothing_left(deployment)
    assert (tmp_path / "logs" / f"{name}-1" / "gm-0.log").stat().st_size > 0, "the GM's log was not kept"


def test_a_deployment_that_fails_to_start_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    build_images()
    deployment = ContainerDeployment(gms=1, lms=1, workers_per_lm=1, worker_timeout=-1.0, log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="lm-0 exited") as failed, deployment:
        pass
    assert "worker_timeout" in str(failed.value).lower(), failed.value  # the LM's own message, with its log
    _nothing_left(deployment)
    assert "worker_timeout" in (tmp_path / "lm-0.log").read_text().lower()
