"""The suite's lanes (tests/support/lanes.py): what the fast lane leaves out, which tests stay on one
worker together."""

from __future__ import annotations

import pytest
from tests.support import lanes

CLUSTER_TEST = """
def test_trains(cluster):
    pass
"""
SHARED_MODULE_FIXTURE = """
import pytest

@pytest.fixture(scope="module")
def trained():
    return 1

def test_one(trained):
    pass

def test_two(trained):
    pass

def test_alone():
    pass
"""
FAST_AND_NOT = """
import pytest

@pytest.fixture
def control_plane():
    return 1

@pytest.fixture
def kube(control_plane):
    return 1

def test_pure():
    pass

def test_on_the_api_server(kube):
    pass

@pytest.mark.slow
def test_trains_a_model():
    pass
"""


@pytest.fixture
def items(pytester: pytest.Pytester) -> dict[str, pytest.Item]:
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    # plain folders, imported by path: the names must not meet this repository's own tests package
    (pytester.path / "tests/cluster").mkdir(parents=True)
    (pytester.path / "tests/e2e").mkdir()
    (pytester.path / "tests/cluster/test_flow.py").write_text(CLUSTER_TEST)
    (pytester.path / "tests/cluster/conftest.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='session')\ndef cluster():\n    return 1\n"
    )
    (pytester.path / "tests/e2e/test_shared.py").write_text(SHARED_MODULE_FIXTURE)
    (pytester.path / "tests/e2e/test_lane.py").write_text(FAST_AND_NOT)
    collected, _ = pytester.inline_genitems("tests", "--import-mode=importlib")
    return {item.nodeid: item for item in collected}


def group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return None if marker is None else str(marker.args[0])


def test_cluster_tests_share_one_worker_and_a_module_fixture_keeps_its_module_together(
    items: dict[str, pytest.Item],
) -> None:
    lanes.group_for_workers(list(items.values()))
    assert group(items["tests/cluster/test_flow.py::test_trains"]) == lanes.CLUSTER_GROUP
    assert group(items["tests/e2e/test_shared.py::test_one"]) == "tests/e2e/test_shared.py"
    assert group(items["tests/e2e/test_shared.py::test_two"]) == "tests/e2e/test_shared.py"
    # a test that does not use the module's fixture may go to any worker
    assert group(items["tests/e2e/test_shared.py::test_alone"]) is None
    assert group(items["tests/e2e/test_lane.py::test_pure"]) is None


def test_the_fast_lane_leaves_out_servers_and_slow_tests(items: dict[str, pytest.Item]) -> None:
    kept, left = lanes.fast_lane(list(items.values()))
    assert "tests/e2e/test_lane.py::test_pure" in {i.nodeid for i in kept}
    assert {i.nodeid for i in left} >= {
        "tests/cluster/test_flow.py::test_trains",  # the cluster fixture
        "tests/e2e/test_lane.py::test_on_the_api_server",  # control_plane, through kube
        "tests/e2e/test_lane.py::test_trains_a_model",  # marked slow
    }
    assert not {i.nodeid for i in kept} & {i.nodeid for i in left}


@pytest.mark.parametrize("name", ["torch", "torch.nn.functional", "mlflow.exceptions", "trl", "datasets"])
def test_a_heavy_import_skips_what_asked_for_it(name: str) -> None:
    with pytest.raises(pytest.skip.Exception, match=f"imports {name.partition('.')[0]}: left out"):
        lanes._HeavyImportSkips().find_spec(name)


@pytest.mark.parametrize("name", ["kubetune_api.spec", "yaml", "pydantic", "torchvision_like", "mlflowish"])
def test_light_imports_go_through(name: str) -> None:
    assert lanes._HeavyImportSkips().find_spec(name) is None
