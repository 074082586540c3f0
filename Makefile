.PHONY: run test test-fast lint crd docs images
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
# `make images`: the images as the chart names them, <IMAGE_REGISTRY>/<image>:<TAG>, TAG by default the
# chart's appVersion (what the chart pulls when operator.image.tag / trainer.image.tag are empty).
# For a mirror: make images IMAGE_REGISTRY=registry.example.com/kubetune TAG=0.1.0
# One image: make images IMAGES=operator. The engine: docker, else podman (or CONTAINER_ENGINE=...).
IMAGE_REGISTRY ?= ghcr.io/kubetune
TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/kubetune/Chart.yaml)
IMAGES ?= operator trainer
CONTAINER_ENGINE ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)
images: ## build the operator and trainer images, tagged as the chart expects (IMAGE_REGISTRY, TAG)
	@if [ -z "$(CONTAINER_ENGINE)" ]; then \
	  echo "make images: neither docker nor podman is on PATH: install one (or set CONTAINER_ENGINE)" >&2; \
	  exit 1; \
	fi
	@if [ -z "$(TAG)" ]; then \
	  echo "make images: no TAG, and no appVersion in charts/kubetune/Chart.yaml" >&2; exit 1; \
	fi
	@for image in $(IMAGES); do \
	  echo "$(CONTAINER_ENGINE) build -f images/$$image/Dockerfile -t $(IMAGE_REGISTRY)/$$image:$(TAG) ."; \
	  "$(CONTAINER_ENGINE)" build -f "images/$$image/Dockerfile" -t "$(IMAGE_REGISTRY)/$$image:$(TAG)" . \
	    || exit 1; \
	done
