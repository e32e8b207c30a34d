"""The HTTP handlers, one module per group of endpoints (tiny.routes maps URLs to them).

- :mod:`tiny.handlers.base`: typed dependencies, the JSON error shape, limits, auth, and the
  rule for ``Connection: close``;
- :mod:`tiny.handlers.ingest`: ``POST /ingest``;
- :mod:`tiny.handlers.status`: ``/healthz``, ``/metrics`` and the JSON 404;
- :mod:`tiny.handlers.analytics`: the ``/api/...`` analytics endpoints;
- :mod:`tiny.handlers.dashboard`: the dashboard page at ``/``.
"""
