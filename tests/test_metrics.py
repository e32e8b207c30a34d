"""The server's metrics (tiny.metrics): /metrics of a real server of two workers, and its counters moving.

Each worker writes its values to the multiprocess directory; a scrape of any worker sums
every worker's (prometheus-client's multiprocess mode). The server runs in processes of its
own: two workers, their requests counted in one scrape, are the point.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import Server, record


def scrape(server: Server) -> Samples:
    """Every sample of one scrape: (name, sorted labels) -> value."""
    response = server.request("GET", "/metrics")
    assert response.status == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much the sample ``name`` with ``labels`` grew from one scrape to the next."""
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(tmp_path_factory.mktemp("metrics") / "data", "--public-downloads", processes=2) as running:
        yield running


def _body(valid: int, invalid: int) -> bytes:
    lines = [json.dumps(record(ip_id=n + 1)) for n in range(valid)] + ['{"date": "not a date"}'] * invalid
    return "\n".join(lines).encode() + b"\n"


def test_ingest_counts_its_requests_records_and_bytes_across_workers(server: Server) -> None:
    before = scrape(server)
    body = _body(valid=5, invalid=2)
    for _ in range(10):  # over new connections: both workers take some (SO_REUSEPORT)
        assert server.ingest(body).status == 200
    after = scrape(server)
    assert moved(before, after, "tiny_received_bytes_total") == 10 * len(body)
    assert moved(before, after, "tiny_records_total", result="valid") == 50
    assert moved(before, after, "tiny_records_total", result="invalid") == 20
    assert moved(before, after, "tiny_requests_total", handler="ingest", status="200") == 10
    heads = [moved(before, after, "tiny_ingest_heads_total", parser=parser) for parser in ("fast", "tornado")]
    assert sum(heads) == 10


def _written(data: Path) -> int:
    """The bytes of the data dir's day files and rejects files."""
    return sum(path.stat().st_size for path in [*data.glob("*.csv"), *data.glob("rejects/*.ndjson")])


def test_flushes_count_the_bytes_they_wrote(server: Server) -> None:
    assert server.data_dir is not None
    assert server.ingest(_body(valid=1, invalid=1)).status == 200  # the day and rejects files exist
    before, size = scrape(server), _written(server.data_dir)
    assert server.ingest(_body(valid=3, invalid=1)).status == 200  # answered once written
    after = scrape(server)
    assert moved(before, after, "tiny_flushed_bytes_total") == _written(server.data_dir) - size > 0
    assert moved(before, after, "tiny_flush_duration_seconds_count") >= 1


def test_reads_count_by_handler_and_status(server: Server) -> None:
    before = scrape(server)
    # answers that need no analytics process: its cold start is no part of what is counted
    assert server.request("GET", "/api/days?after=9999-12-31").status == 200  # an empty page
    assert server.request("GET", "/api/days/2014-13-01/summary").status == 400
    assert server.request("GET", "/downloads/").status == 200  # where the API is documented
    assert server.request("GET", "/no/such/path").status == 404
    after = scrape(server)
    for handler, status in (("api", "200"), ("api", "400"), ("downloads", "200"), ("other", "404")):
        labels = {"handler": handler, "status": status}
        assert moved(before, after, "tiny_requests_total", **labels) == 1, labels
    assert moved(before, after, "tiny_request_duration_seconds_count", handler="api") == 2


def test_a_scrape_holds_only_the_servers_own_metrics(server: Server) -> None:
    names = {name for name, _ in scrape(server)}
    assert names and all(name.startswith(("tiny_", "python_", "process_")) for name in names), names
