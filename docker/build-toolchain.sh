#!/bin/sh
# Usage: build-toolchain.sh    (the Dockerfile's builder stage, as root; never in a final image)
#
# Installs what builds the wheel of tiny-data-server (the package tiny + its Rust extension
# tiny._codec) on a Debian-like base:
#   - Rust from the base's own Debian release: rustc-web/cargo-web where the release has them
#     (bookworm: its rustc is 1.63, below the crate's rust-version 1.85; rustc-web is 1.96 and
#     installs /usr/bin/rustc and /usr/bin/cargo itself), else rustc/cargo (trixie: 1.85);
#     gcc and libc6-dev link the extension. PyO3 needs no Python headers.
#   - /opt/build/ca.pem: the base's CA bundle, plus /opt/build/extra-ca.pem when the build
#     context had build/extra-ca.pem (a TLS-intercepting proxy; docker/build-offline.sh puts the
#     host's bundle there). The builder's PIP_CERT, SSL_CERT_FILE and CARGO_HTTP_CAINFO name it.
set -eu

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if apt-cache show rustc-web >/dev/null 2>&1 && apt-cache show cargo-web >/dev/null 2>&1; then
    rust="rustc-web cargo-web"
else
    rust="rustc cargo"
fi
# shellcheck disable=SC2086  # $rust is two package names
apt-get install -y -qq --no-install-recommends $rust gcc libc6-dev ca-certificates >/dev/null
rm -rf /var/lib/apt/lists/*
rustc --version
cargo --version

cat /etc/ssl/certs/ca-certificates.crt > /opt/build/ca.pem
if [ -f /opt/build/extra-ca.pem ]; then
    echo "trusting build/extra-ca.pem besides the base's CAs (pip, cargo)"
    cat /opt/build/extra-ca.pem >> /opt/build/ca.pem
fi
