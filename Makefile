.PHONY: run test lint crd
run:  ## fine-tune the tiny model locally (the main job)
	bash hack/local-run.sh
test: ## set up, build the test control plane, lint, type-check, run all tests
	bash hack/test.sh
crd:  ## regenerate crds/ from the typed API models
	.venv/bin/python -m kubetune_api.crd --write crds/kubetune.io_finetunejobs.yaml
