"""The copies of tiny/limits.py outside Python agree with it: nginx, docker compose, supervisord."""

from __future__ import annotations

import re

from tests.support import ROOT
from tiny import config, limits

PROXY = (ROOT / "nginx" / "proxy.conf").read_text()


def nginx_seconds(directive: str) -> float:
    found = re.search(rf"(?m)^{directive}\s+(\d+)s;", PROXY)
    assert found, f"nginx/proxy.conf has no {directive}"
    return float(found.group(1))


def test_nginx_refuses_the_bodies_the_app_refuses_with_the_same_number() -> None:
    found = re.search(r"(?m)^client_max_body_size\s+(\d+)m;", PROXY)
    assert found and int(found.group(1)) * 1024**2 == limits.MAX_BODY
    assert f"body is larger than the limit of {limits.MAX_BODY} bytes" in PROXY


def test_nginx_waits_longer_for_an_answer_than_the_app_waits_for_its_lock_and_passes_a_timeout_on() -> None:
    read = nginx_seconds("proxy_read_timeout")
    assert read > limits.LOCK_TIMEOUT + 5  # the app's slowest answer: a lock wait, then 503
    assert nginx_seconds("proxy_next_upstream_timeout") >= 2 * read  # a timed-out request goes on


def test_compose_passes_the_same_body_limit_and_waits_out_the_drain() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    default = re.search(r"TINY_MAX_BODY: \$\{TINY_MAX_BODY:-(\w+)\}", compose)
    assert default and config.parse_size(default.group(1)) == limits.MAX_BODY
    graces = re.findall(r"stop_grace_period: (\d+)s", compose)
    assert graces and all(float(grace) >= limits.DRAIN_TIMEOUT + 3 for grace in graces)


def test_supervisord_waits_out_the_drain_before_sigkill() -> None:
    found = re.search(r"(?m)^stopwaitsecs=(\d+)", (ROOT / "supervisor" / "supervisord.conf").read_text())
    assert found and float(found.group(1)) >= limits.DRAIN_TIMEOUT + 3


def test_the_readme_states_the_analytics_deadlines_of_tiny_limits() -> None:
    """The README's 10 s for a query and 60 s for a stuck pool job are limits.FOLD_SECONDS and
    limits.ANALYTICS_JOB_SECONDS."""
    readme = (ROOT / "README.md").read_text()
    assert f"within {limits.FOLD_SECONDS:g} s of its arrival" in readme
    assert f"job running over {limits.ANALYTICS_JOB_SECONDS:g} s" in readme.replace("\n", " ")
    assert f"half its {limits.ANALYTICS_JOB_SECONDS:g} s deadline" in readme
