# Scale-out targets (docs/scaling-out.md): the supervisord cluster and the Docker images.
# Included by the Makefile, which defines VENV, BIN and the venv and sysdeps targets.

SUPERVISOR_CONF := supervisor/supervisord.conf
DOCKER_TESTS    := tests/test_docker.py

.PHONY: cluster cluster-stop images-offline test-docker

cluster: venv sysdeps ## nginx on 127.0.0.1:8888 over 4 instances (8001-8004) under supervisord, in the foreground
	mkdir -p data var/log var/nginx
	exec supervisord -n -c $(SUPERVISOR_CONF)

cluster-stop: ## stop a running `make cluster` (drains every instance, then exits)
	supervisorctl -c $(SUPERVISOR_CONF) shutdown

images-offline: ## build the app (TINY_IMAGE_TARGET, default analytics) and nginx images without a registry (Debian root)
	docker/build-offline.sh

test-docker: venv ## the docker compose test: images-offline, up --scale tiny=4, scale 2 and 4, stop
	TINY_DOCKER_TESTS=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(DOCKER_TESTS)
