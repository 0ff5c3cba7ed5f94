"""The user's own server: launched from their command or attached by URL (``capture.py``), its life and HTTP client
(``server.py``) and its ``/metrics`` read with Prometheus' own parser (``metrics.py``)."""
