.PHONY: run test test-fast lint crd docs
run:  ## fine-tune the tiny model locally (the main job)
	bash hack/local-run.sh
test: ## set up, build the test control plane, lint, type-check, run all tests
	bash hack/test.sh
test-fast: ## the inner loop (under a minute): tests that need no server, subprocess or heavy import
	bash hack/setup.sh
	.venv/bin/pytest tests/unit --fast -q -p no:cacheprovider "-n$${KUBETUNE_TEST_WORKERS:-0}"
crd:  ## regenerate crds/, the chart's copy and docs/api.md from the typed API models
	.venv/bin/python -m kubetune_api.crd --write crds/kubetune.io_finetunejobs.yaml
	cp crds/kubetune.io_finetunejobs.yaml charts/kubetune/files/crds/kubetune.io_finetunejobs.yaml
	.venv/bin/python -m kubetune_api.docs --write docs/api.md
docs: ## build the documentation site from docs/ into out/site (strict: a broken link or anchor fails)
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir out/site
