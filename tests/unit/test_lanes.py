"""The suite's lanes (tests/support/lanes.py): what the fast lane leaves out, which tests stay on one
worker together."""

from __future__ import annotations

import pytest
from tests.support import lanes
from tests.support.controlplane import REPO

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
    (pytester.path / "tests/unit").mkdir()
    (pytester.path / "tests/cluster/test_flow.py").write_text(CLUSTER_TEST)
    (pytester.path / "tests/cluster/conftest.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='session')\ndef cluster():\n    return 1\n"
    )
    (pytester.path / "tests/e2e/test_shared.py").write_text(SHARED_MODULE_FIXTURE)
    (pytester.path / "tests/unit/test_lane.py").write_text(FAST_AND_NOT)
    collected, _ = pytester.inline_genitems("tests", "--import-mode=importlib")
    return {item.nodeid: item for item in collected}


def test_cluster_tests_share_their_lanes_and_a_module_fixture_keeps_its_module_together(
    pytester: pytest.Pytester, items: dict[str, pytest.Item]
) -> None:
    shared = lanes.module_fixture_modules(pytester.path)
    assert shared == {"tests/e2e/test_shared.py"}
    unit = lanes.work_units(list(items), shared, 2)
    assert unit["tests/cluster/test_flow.py::test_trains"] == f"{lanes.CLUSTER_GROUP}-0"
    assert unit["tests/e2e/test_shared.py::test_one"] == unit["tests/e2e/test_shared.py::test_alone"]
    assert unit["tests/e2e/test_shared.py::test_one"] == "tests/e2e/test_shared.py"
    # elsewhere each test is a unit of its own
    assert unit["tests/unit/test_lane.py::test_pure"] == "tests/unit/test_lane.py::test_pure"


def test_cluster_tests_are_dealt_to_the_lanes_and_a_shared_module_stays_whole() -> None:
    ids = [
        "tests/cluster/test_a.py::test_1",
        "tests/cluster/test_a.py::test_2",
        "tests/cluster/test_hub.py::test_1",  # a module-wide fixture: one piece
        "tests/cluster/test_hub.py::test_2",
        "tests/cluster/test_hub.py::test_3",
        "tests/cluster/test_b.py::test_1",
        "tests/cluster/test_b.py::test_2",
        "tests/unit/test_u.py::test_1",
    ]
    unit = lanes.work_units(ids, frozenset({"tests/cluster/test_hub.py"}), 2)
    lane = {nodeid: unit[nodeid] for nodeid in ids if nodeid.startswith("tests/cluster/")}
    assert set(lane.values()) == {"cluster-0", "cluster-1"}
    assert len({lane[f"tests/cluster/test_hub.py::test_{i}"] for i in (1, 2, 3)}) == 1
    # the fewest tests so far: a1 -> 0, a2 -> 1, the hub's three -> 0, b1 and b2 -> 1
    assert [lane[i] for i in ids[:7]] == [
        "cluster-0",
        "cluster-1",
        *["cluster-0"] * 3,
        "cluster-1",
        "cluster-1",
    ]
    assert unit["tests/unit/test_u.py::test_1"] == "tests/unit/test_u.py::test_1"
    # one lane: every cluster test in one unit, as before the lanes
    assert set(lanes.work_units(ids, frozenset(), 1).values()) == {
        "cluster-0",
        "tests/unit/test_u.py::test_1",
    }


@pytest.mark.parametrize("raw", ["two", "1.5"])
def test_a_cluster_lanes_setting_that_is_no_number_is_refused(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lanes.CLUSTER_LANES_ENV, raw)
    with pytest.raises(pytest.UsageError, match=f"{lanes.CLUSTER_LANES_ENV}='{raw}'"):
        lanes.cluster_lanes()


def test_a_conftest_with_a_module_fixture_groups_the_modules_below_it(pytester: pytest.Pytester) -> None:
    (pytester.path / "tests/helm").mkdir(parents=True)
    (pytester.path / "tests/helm/conftest.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='module')\ndef chart():\n    return 1\n"
    )
    (pytester.path / "tests/helm/test_a.py").write_text("def test_a():\n    pass\n")
    (pytester.path / "tests/test_b.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='session')\ndef server():\n    return 1\n"
    )
    assert lanes.module_fixture_modules(pytester.path) == {"tests/helm/test_a.py"}


@pytest.mark.slow  # a parallel pytest run of its own
@pytest.mark.parametrize("cluster_lanes", [1, 2])
def test_the_parallel_run_runs_the_cluster_tests_on_as_many_workers_as_lanes(
    pytester: pytest.Pytester, cluster_lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through pytest-xdist itself: the scheduler is the one the suite's conftest installs."""
    monkeypatch.setenv(lanes.CLUSTER_LANES_ENV, str(cluster_lanes))
    (pytester.path / "tests/cluster").mkdir(parents=True)
    out = pytester.path / "workers.txt"
    record = f"import os\n\ndef record(name):\n    open({str(out)!r}, 'a').write(name + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
    (pytester.path / "tests/cluster/test_flow.py").write_text(
        record + "".join(f"\n\ndef test_c{i}():\n    record('cluster')\n" for i in range(8))
    )
    (pytester.path / "tests/test_other.py").write_text(
        record + "".join(f"\n\ndef test_o{i}():\n    record('other')\n" for i in range(8))
    )
    pytester.makeconftest(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.support import lanes\n\n"
        "def pytest_xdist_make_scheduler(config, log):\n    return lanes.scheduler(config, log)\n"
    )
    result = pytester.runpytest_subprocess("-n", "3", "-p", "no:cacheprovider", "--import-mode=importlib")
    result.assert_outcomes(passed=16)
    rows = [line.split() for line in out.read_text().splitlines()]
    assert len({worker for name, worker in rows if name == "cluster"}) == cluster_lanes
    assert len(rows) == 16


def test_the_fast_lane_leaves_out_servers_and_slow_tests(items: dict[str, pytest.Item]) -> None:
    kept, left = lanes.fast_lane(list(items.values()))
    assert "tests/unit/test_lane.py::test_pure" in {i.nodeid for i in kept}
    assert {i.nodeid for i in left} >= {
        "tests/cluster/test_flow.py::test_trains",  # the cluster fixture
        "tests/unit/test_lane.py::test_on_the_api_server",  # control_plane, through kube
        "tests/unit/test_lane.py::test_trains_a_model",  # marked slow
        "tests/e2e/test_shared.py::test_alone",  # not a unit test
    }
    assert not {i.nodeid for i in kept} & {i.nodeid for i in left}


@pytest.mark.parametrize("name", ["torch", "torch.nn.functional", "mlflow.exceptions", "trl", "datasets"])
def test_a_heavy_import_skips_what_asked_for_it(name: str) -> None:
    with pytest.raises(pytest.skip.Exception, match=f"imports {name.partition('.')[0]}: left out"):
        lanes._HeavyImportSkips().find_spec(name)


@pytest.mark.parametrize("name", ["kubetune_api.spec", "yaml", "pydantic", "torchvision_like", "mlflowish"])
def test_light_imports_go_through(name: str) -> None:
    assert lanes._HeavyImportSkips().find_spec(name) is None


@pytest.mark.slow  # a parallel pytest run of its own
def test_a_worker_stops_its_cluster_right_after_its_lane(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/cluster/conftest.py's teardown hook, through pytest-xdist: one worker runs the cluster
    lane first (the biggest unit), stops the cluster right after its last test, then the others."""
    monkeypatch.setenv(lanes.CLUSTER_LANES_ENV, "1")
    out = pytester.path / "events.txt"
    record = f"def record(what):\n    open({str(out)!r}, 'a').write(what + '\\n')\n"
    (pytester.path / "tests/cluster").mkdir(parents=True)
    (pytester.path / "tests/cluster/conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import importlib.util, pytest\n"
        f"spec = importlib.util.spec_from_file_location('real_cluster_conftest', {str(REPO / 'tests/cluster/conftest.py')!r})\n"
        "real = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(real)\n"
        "pytest_runtest_teardown = real.pytest_runtest_teardown  # the hook under test\n"
        + record
        + "\n@pytest.fixture(scope='session')\ndef cluster():\n"
        "    record('start')\n    yield 'c'\n    record('stop')\n"
    )
    (pytester.path / "tests/cluster/test_flow.py").write_text(
        record + "".join(f"\n\ndef test_c{i}(cluster):\n    record('cluster')\n" for i in range(3))
    )
    (pytester.path / "tests/test_other.py").write_text(
        record + "".join(f"\n\ndef test_o{i}():\n    record('other')\n" for i in range(3))
    )
    pytester.makeconftest(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.support import lanes\n\n"
        "def pytest_xdist_make_scheduler(config, log):\n    return lanes.scheduler(config, log)\n"
    )
    result = pytester.runpytest_subprocess(
        "-n", "1", "-p", "no:cacheprovider", "-p", "no:randomly", "--import-mode=importlib"
    )
    result.assert_outcomes(passed=6)
    events = out.read_text().split()
    assert events == ["start", "cluster", "cluster", "cluster", "stop", "other", "other", "other"], events
