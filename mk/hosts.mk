# The rehearsal of several hosts (docker/hosts.yml): its image so far. Included by the Makefile.
# `make hosts` / `make hosts-down` come with cluster mode's Tiny hosts (issue 46).

.PHONY: images-cluster

# A prerequisite of images-offline (mk/scaleout.mk): `make images-offline` builds this image too.
images-offline: images-cluster

images-cluster: ## build tiny-data-server-pg:local (PostgreSQL 15, Patroni, etcd: docker/hosts.yml) without a registry
	docker/build-cluster.sh
