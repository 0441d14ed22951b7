# The two commands a newcomer needs:
#   make demo   bring everything up and send one real video through the system
#   make test   every test, against real PostgreSQL, RabbitMQ, Garage and FFmpeg
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
VIDEO ?=

.PHONY: help infra build up down status demo test bench fuzz chaos modgraph fmt lint clean-test-dbs

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

infra: ## install/start PostgreSQL, RabbitMQ, Garage and the FFmpeg build deps (idempotent)
	scripts/stack.sh infra-up

build: infra ## build every binary (debug)
	$(CARGO) build --workspace --bins

up: build ## the local stack plus the three services in the background (idempotent; restarts a service whose binary was rebuilt)
	scripts/up.sh

down: ## stop exactly what `make up` (and `make demo`) started
	scripts/demo.sh stop-receiver
	scripts/services.sh stop || true
	scripts/stack.sh infra-down

status: ## what is running (infrastructure, the three services, the demo's webhook receiver)
	@rc=0; scripts/stack.sh status || rc=1; scripts/services.sh status || rc=1; scripts/demo.sh status-receiver; exit $$rc

# demo checks VIDEO and port 9000 first, so a typo fails in a second, not after the build.
demo: ## upload a real video, wait for the transcode and the signed webhook (VIDEO=path to use your own)
	@scripts/demo.sh check "$(VIDEO)"
	@$(MAKE) --no-print-directory up
	scripts/demo.sh "$(VIDEO)"

test: build ## every test (unit, integration, end-to-end) against the real stack
	scripts/test.sh

bench: build ## benchmarks, each reported as a ratio to a baseline measured in the same run
	scripts/bench.sh

fuzz: build ## schemathesis against the served OpenAPI document, 200 examples per operation
	FUZZ_EXAMPLES=200 scripts/fuzz-api.sh

chaos: build ## the full chaos run: 50 uploads while every part is killed or restarted (SEED=n to repeat a run)
	scripts/chaos.sh $(if $(SEED),--seed $(SEED),)

modgraph: ## no import circle in any crate, and the api's layers in order (a step of `make test`)
	$(CARGO) run -q -p vid-modgraph

fmt: ## format the code
	$(CARGO) fmt --all

lint: ## clippy with warnings as errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean-test-dbs: ## drop the databases tests created
	scripts/test.sh --clean-only

.PHONY: images container-test
images: ## the service images from deploy/Dockerfile with Podman (base images made here, cached in .local/images)
	scripts/images.sh

container-test: build images ## the images and the k8s manifests (podman kube play) run against the local stack
	scripts/container-test.sh
	scripts/kube-test.sh

.PHONY: compose-test
compose-test: build images ## deploy/docker-compose.yml with podman-compose (host network, ports 28xxx, local stand-ins): upload to signed webhook, then down
	scripts/compose-test.sh
