"""Tiny Data Server: an HTTP ingest server for CRAN download logs."""

__version__ = "0.1.0"
