"""A closed-loop POST load generator that can give every request its own Idempotency-Key.

ab sends one fixed set of headers, and wrk's Lua builds each request as one new string: with a
header that changes per request, wrk copies the whole body every time and took 3x the CPU of
the same run without it (1,600-record bodies), which skews a with/without comparison on two
shared cores. Here every request is two writes, its headers and the one body buffer, so the
generator costs the same with and without keys.

Usage:
    python bench/post_load.py URL BODY [--concurrency 8] [--seconds 4] [--key-prefix P] [--gzip]

Prints one JSON line: requests, non2xx, failed, seconds, and the latency mean and percentiles
(ms) of the answered requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from urllib.parse import urlsplit


async def _client(
    host: str, port: int, path: str, body: bytes, extra: str, prefix: str | None, number: int, deadline: float
) -> tuple[list[float], int, int]:
    """One keep-alive connection posting until ``deadline``: (latencies, non-2xx, failed).
    A server that ends the connection after an answer with ``Connection: close`` (nginx does
    after ``keepalive_requests``, 1,000 by default) gets a new one, as a client would."""
    latencies: list[float] = []
    non2xx = failed = 0
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/x-ndjson\r\n{extra}"
    head += f"Content-Length: {len(body)}\r\n"
    sent = 0
    while time.monotonic() < deadline:
        sent += 1
        key = f"Idempotency-Key: {prefix}-{number}-{sent}\r\n" if prefix else ""
        started = time.monotonic()
        writer.write((head + key + "\r\n").encode())
        writer.write(body)
        closing = False
        try:
            status_line = await reader.readline()
            if not status_line:
                raise asyncio.IncompleteReadError(b"", None)  # closed without an answer
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    closing = True
            await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            failed += 1
            break
        latencies.append(time.monotonic() - started)
        if not status_line[9:10] == b"2":
            non2xx += 1
        if closing:
            writer.close()
            reader, writer = await asyncio.open_connection(host, port)
    writer.close()
    return latencies, non2xx, failed


async def run(url: str, body: bytes, concurrency: int, seconds: float, prefix: str | None, gzip: bool) -> dict:
    parts = urlsplit(url)
    extra = "Content-Encoding: gzip\r\n" if gzip else ""
    started = time.monotonic()
    deadline = started + seconds
    results = await asyncio.gather(
        *(
            _client(
                parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/", body, extra, prefix, n, deadline
            )
            for n in range(concurrency)
        )
    )
    elapsed = time.monotonic() - started
    latencies = sorted(ms * 1000 for result in results for ms in result[0])

    def percentile(p: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * p / 100))], 3) if latencies else None

    return {
        "requests": len(latencies),
        "non2xx": sum(r[1] for r in results),
        "failed": sum(r[2] for r in results),
        "seconds": round(elapsed, 3),
        "mean_ms": round(statistics.fmean(latencies), 3) if latencies else None,
        "p50_ms": percentile(50),
        "p90_ms": percentile(90),
        "p99_ms": percentile(99),
        "max_ms": round(latencies[-1], 3) if latencies else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("body", type=Path)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--key-prefix", help="send Idempotency-Key: PREFIX-<connection>-<n> with every request")
    parser.add_argument("--gzip", action="store_true", help="the body is gzip (sends Content-Encoding: gzip)")
    args = parser.parse_args()
    result = asyncio.run(
        run(args.url, args.body.read_bytes(), args.concurrency, args.seconds, args.key_prefix, args.gzip)
    )
    print("LOAD " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
