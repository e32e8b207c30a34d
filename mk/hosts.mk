# The rehearsal of several hosts (docker/hosts.yml, docs/scaling-out.md): its images, `make hosts`
# and `make hosts-down` (docker/hosts.sh). Included by the Makefile.

TINY_HOSTS_PORT ?= 8890

.PHONY: images-cluster hosts hosts-down

# A prerequisite of images-offline (mk/scaleout.mk): `make images-offline` builds this image too.
images-offline: images-cluster

images-cluster: ## build tiny-data-server-pg:local (PostgreSQL 15, Patroni, etcd: docker/hosts.yml) without a registry
	docker/build-cluster.sh

hosts: ## start, detached, 3 Tiny hosts in cluster mode, PostgreSQL under Patroni and nginx on 127.0.0.1:TINY_HOSTS_PORT (8890); returns once all is ready
	TINY_HOSTS_PORT=$(TINY_HOSTS_PORT) docker/hosts.sh up

hosts-down: ## remove what `make hosts` started: every container, network and volume (day files and database included)
	docker/hosts.sh down
