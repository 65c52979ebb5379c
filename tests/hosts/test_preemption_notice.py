"""containers.preemption_notice on a lab host over real SSH: the host's own metadata confirms a notice, or nothing."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.containers import preemption_notice
from activities.contracts.containers import NoticeInput
from lab.hosts import LabSpec, ssh_target
from tests.hosts.labkit import HTTP_PORT

_PATH = "latest/meta-data/spot/instance-action"


def _input(lab: LabSpec, deadline: float, path: str = _PATH) -> NoticeInput:
    url = f"http://{lab.address('consul1')}:{HTTP_PORT}/{path}"
    return NoticeInput(host="consul1", hosts=[ssh_target(lab, "consul1")], metadata_urls={"consul1": url},
                       deadline=f"{deadline:.3f}")


def _notice(lab: LabSpec, at: float) -> None:
    """What the provider's metadata service answers on the host: AWS's instance-action document."""
    path = Path(lab.state_dir) / "www" / _PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    when = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(json.dumps({"action": "terminate", "time": when}))


async def test_the_hosts_own_notice_confirms_the_deadline(lab):
    at = int(time.time()) + 60
    _notice(lab, at)
    confirmed = await preemption_notice(_input(lab, at + 0.4))
    assert confirmed.host == "consul1" and confirmed.action == "terminate" and abs(confirmed.off_by_seconds) < 1


async def test_no_notice_on_the_host_or_another_time_drains_nothing(lab):
    at = int(time.time()) + 60
    _notice(lab, at)
    with pytest.raises(ApplicationError) as mismatch:
        await preemption_notice(_input(lab, at + 3600))
    assert mismatch.value.type == "NoticeMismatch" and mismatch.value.non_retryable
    assert "-3600 s from the deadline the run was given" in str(mismatch.value)
    with pytest.raises(ApplicationError) as none:
        await preemption_notice(_input(lab, at, path="latest/meta-data/spot/nothing-here"))
    assert none.value.type == "NoPreemptionNotice" and none.value.non_retryable
    assert none.value.message == "consul1 reports no preemption notice (its metadata answered 404): nothing is drained"
