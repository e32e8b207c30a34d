# Scale-out targets (docs/scaling-out.md): the supervisord cluster and the Docker images.
# Included by the Makefile, which defines VENV, BIN and the venv and sysdeps targets.

SUPERVISOR_CONF := supervisor/supervisord.conf
DOCKER_TESTS    := tests/test_docker.py
TINY_CLUSTER_PORT ?= 8000
TINY_CLUSTER_SIZE ?= 4

.PHONY: cluster cluster-stop images-offline test-docker

cluster: venv sysdeps ## nginx on 127.0.0.1:8888 over TINY_CLUSTER_SIZE (4) instances on TINY_CLUSTER_PORT+1.. (8001-), in the foreground
	mkdir -p data var/log var/nginx
	TINY_CLUSTER_PORT=$(TINY_CLUSTER_PORT) TINY_CLUSTER_SIZE=$(TINY_CLUSTER_SIZE) exec supervisord -n -c $(SUPERVISOR_CONF)

cluster-stop: ## stop a running `make cluster` (drains every instance, then exits)
	supervisorctl -c $(SUPERVISOR_CONF) shutdown

images-offline: venv ## build the app and nginx images without a registry (Debian root + host-downloaded wheels)
	docker/build-offline.sh

test-docker: venv ## the docker compose test: images-offline, up --scale tiny=4, scale 2 and 4, stop
	TINY_DOCKER_TESTS=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(DOCKER_TESTS)
