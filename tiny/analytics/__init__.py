"""Download analytics over the day files ("whales"), answered off the ingest path.

Who downloaded most on a day (the whales), how their traffic compares with everyone's hour by
hour, and what exactly one whale downloaded, like the cranwhales app. Every worker process and
every container answers the same: the answers come from the live aggregate store of the data
dir (tiny.aggregates), or, for one whale's own downloads, from the day file's rows.

- :mod:`tiny.analytics.answers`: the dashboard's queries, and their answers and charts from the
  aggregates (in the pool, after tiny.live folded the day up to its committed size);
- :mod:`tiny.analytics.service`: the worker side, one ``Analytics`` per worker process: the
  pool it owns and closes (single flight, queue bound), and the queries that read rows;
- :mod:`tiny.analytics.rows`: the pool side of those (one whale's rows found by a byte
  search and read, its downloads), with :mod:`tiny.analytics.names` for the whale names;
- :mod:`tiny.analytics.pool_process`: what each pool process does first (its signals, its end
  with its worker, its caches' budget);
- :mod:`tiny.analytics.caches`: every analytics cache of a process under one byte budget;
- :mod:`tiny.analytics.json_bytes`: answers as JSON bytes;
- :mod:`tiny.analytics.charts`: the dashboard's charts, drawn in the pool as SVG (with
  :mod:`tiny.analytics.svg`) from the aggregates, and one whale's detail from its rows;
- :mod:`tiny.analytics.cpu`: the pool processes' shared CPU quota (a cgroup).

The HTTP handlers are in :mod:`tiny.handlers.analytics`.
"""
