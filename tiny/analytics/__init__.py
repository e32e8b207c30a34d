"""Download analytics over the day files ("whales"), computed in a process pool off the ingest path.

Who downloaded most on a day (the whales), how their traffic compares with everyone's hour by
hour, and what exactly one whale downloaded, like the cranwhales app, read from the day files
themselves so that every worker process and every container answers the same.

Split at the process boundary:

- :mod:`tiny.analytics.service`: the worker side, one ``Analytics`` per worker process (cache,
  single flight, the pool it owns and closes);
- :mod:`tiny.analytics.compute`: the pool side (read, parse, aggregate, one whale's downloads,
  their caches), with :mod:`tiny.analytics.names` for the whale names;
- :mod:`tiny.analytics.charts`: the dashboard's matplotlib charts, drawn in the pool.

The HTTP handlers are in :mod:`tiny.handlers.analytics`.
"""
