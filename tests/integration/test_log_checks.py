"""The operator-log check the RBAC and Helm tests rely on: refusals are found, timestamps are not."""

from __future__ import annotations

import pytest
from tests.integration.conftest import denials


@pytest.mark.parametrize(
    "line",
    [
        "[2026-11-30 17:06:04,403] kopf._core.reactor.r [INFO    ] Stop-flag is set to True.",  # kopf's ms
        "2026-11-30 12:37:18.787403 handler succeeded",  # microseconds
        "uid 3f2a-403b-11ee owner set",
        # an object kopf logs whole, whose resourceVersion happens to be 403
        "Creation is in progress: {'metadata': {'name': 'a', 'resourceVersion': '403', 'uid': 'u'}}",
        '{"metadata": {"resourceVersion": "403"}}',
    ],
)
def test_digits_of_a_timestamp_or_uid_are_not_a_refusal(line: str) -> None:
    assert denials(line) == []


@pytest.mark.parametrize(
    "line",
    [
        "APIForbiddenError('jobs.batch is forbidden: User cannot create')",
        "GET https://127.0.0.1:6443/apis/batch/v1/jobs -> (403)",
        "status=403",
        "{'kind': 'Status', 'code': 403, 'reason': 'Denied'}",
    ],
)
def test_a_refusal_is_found(line: str) -> None:
    assert denials(line) == [line]
