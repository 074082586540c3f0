"""A step sizes its thread pools by the CPUs its pod asked for (kubetune_trainer.process.share_cpus):
torch starts one thread per core of the node otherwise, whatever the pod's request, and on a busy
node those threads wait for each other (docs/contributing.md, "Where the CPU goes")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kubetune_trainer.process import cpu_share

CHECK = """
from kubetune_trainer.process import share_cpus
print(share_cpus())
import torch
print(torch.get_num_threads())
"""
CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("requested", "processes", "here", "threads"),
    [
        (8, 1, 96, 8),  # what the pod asked for, not the node's 96
        (8, 4, 96, 2),  # shared among the pod's processes
        (60, 1, 2, 2),  # no more than this machine has
        (1, 8, 96, 1),  # at least one
        (None, 1, 96, None),  # no request: the libraries' own default
    ],
)
def test_each_process_gets_its_share_of_the_pods_cpus(
    requested: int | None, processes: int, here: int, threads: int | None
) -> None:
    assert cpu_share(requested, processes, here) == threads


@pytest.mark.slow  # a process that imports torch
@pytest.mark.parametrize(
    ("env", "printed"),
    [
        ({"KUBETUNE_CPUS": "1"}, ["1", "1"]),
        (
            {"KUBETUNE_CPUS": "1", "OMP_NUM_THREADS": "2"},
            ["None", "2"],
        ),  # set already: it wins (2 cores here)
        ({"KUBETUNE_CPUS": "1", "LOCAL_WORLD_SIZE": "4"}, ["1", "1"]),
        ({}, ["None", str(CORES)]),  # no request: torch's own default, every core
    ],
    ids=["request", "omp-set", "shared", "no-request"],
)
def test_a_steps_process_runs_torch_with_its_share(env: dict[str, str], printed: list[str]) -> None:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "KUBETUNE_CPUS", "LOCAL_WORLD_SIZE")
    }
    out = subprocess.run(
        [sys.executable, "-c", CHECK],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == printed
