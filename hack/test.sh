#!/usr/bin/env bash
# The test command (also what CI runs through .ci/run): set up, build or reuse the control-plane
# binaries, lint, type-check, then the whole test suite against real servers.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# The control plane (kube-apiserver, kubectl, etcd, helm) and the controllers of the real-controller
# tests (tests/cluster: kube-controller-manager, kube-scheduler, KWOK, the Kubeflow Training Operator,
# Kueue), built side by side where missing; its last two lines are their folders
built=$(hack/build-control-plane.sh suite | tail -n 2)
export KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(head -n 1 <<<"$built")}"
export KUBETUNE_CLUSTER_ASSETS="${KUBETUNE_CLUSTER_ASSETS:-$(tail -n 1 <<<"$built")}"
# Kubeflow Trainer v2 and JobSet, for the TrainJob engine's cluster tests (tests/cluster/test_trainjob_*),
# after the others: they share their build cache (about 4.5 minutes cold, once those are built)
if [ -z "${KUBETUNE_TRAINER_V2_ASSETS:-}" ]; then
  KUBETUNE_TRAINER_V2_ASSETS="$(hack/build-control-plane.sh trainer-v2 | tail -n 1)"
fi
export KUBETUNE_TRAINER_V2_ASSETS
# headless Chromium for the docs' screenshot test (tests/unit/test_docs_render.py): Debian's package,
# installed in CI (as root, with apt); elsewhere, or if apt fails, that one test skips and says why
if [ -n "${CI:-}" ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
    || echo "chromium could not be installed: the docs screenshot test will skip" >&2
fi
# the Argo CD health check's Lua VM, built once here rather than by the first test that needs it
hack/build-lua.sh >/dev/null
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
echo "== import contracts"; lint-imports
echo "== CRD drift"; python -m kubetune_api.crd --check crds/kubetune.io_finetunejobs.yaml
echo "== docs"; NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$(mktemp -d)"
# The suite in two parallel workers by default (KUBETUNE_TEST_WORKERS=N: N; 0: this one process),
# each with its own servers, the cluster tests in two lanes, one per worker (tests/support/lanes.py).
# On two cores two workers keep both busy (31.5 minutes against 43 in one process); four took longer
# than one and starved the cluster tests into time-outs (docs/contributing.md, "Where the time
# goes"). The 30 slowest tests are printed.
workers="${KUBETUNE_TEST_WORKERS:-2}"
# The files' order by default; KUBETUNE_TEST_ORDER=random shuffles it (pytest-randomly: modules,
# then the tests in each; the seed is printed first, and `--randomly-seed=N` replays an order).
order=()
if [ "${KUBETUNE_TEST_ORDER:-file}" = file ]; then order=(-p no:randomly); fi
# KUBETUNE_PROC_ACCOUNT=FILE: every Python process of the run (pytest, operators, servers, the pods'
# trainer steps) and every controller stopped by the suite records its CPU seconds into FILE, summed
# up by kind after the run (tests/support/proc_account; docs/contributing.md, "Where the time goes")
if [ -n "${KUBETUNE_PROC_ACCOUNT:-}" ]; then
  KUBETUNE_PROC_ACCOUNT="$(realpath -m "$KUBETUNE_PROC_ACCOUNT")"
  export KUBETUNE_PROC_ACCOUNT PYTHONPATH="$PWD/tests/support/proc_account${PYTHONPATH:+:$PYTHONPATH}"
fi
# One thread per torch process: the suite's trainings are tiny and many run at once (parallel
# workers, pods, the e2e tests' processes). torch sizes its thread pool by the machine's cores, and
# on two busy cores its threads wait for each other: the tiny model's 60 steps took 3 to 4 times the
# CPU with two threads as with one (docs/contributing.md, "Where the CPU goes"). Pods get the
# environment their spec gives them, not this one (the trainer sizes its pool by its CPU request).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "== pytest ($workers workers, ${KUBETUNE_TEST_ORDER:-file} order)"
set +e
pytest -n "$workers" "${order[@]}" --durations=30 "$@"
rc=$?
set -e
if [ -n "${KUBETUNE_PROC_ACCOUNT:-}" ]; then
  echo "== CPU by kind of process ($KUBETUNE_PROC_ACCOUNT)"
  python -m tests.support.proc_account "$KUBETUNE_PROC_ACCOUNT" || true
fi
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
