"""Watch the deployment: live acceptance against the contract's band, as a canary and as Prometheus rules.

- :mod:`~specparity.watch.engines`: each engine release's own metric names, and what turns them on;
- :mod:`~specparity.watch.window`: one reading of those metrics, and the acceptance of a window between two readings
  (both definitions, named; 95% Wilson intervals);
- :mod:`~specparity.watch.band`: the band a window is judged against (the contract's figures as the ceiling, a
  calibrated baseline, a named floor) and the baseline file beside the contract;
- :mod:`~specparity.watch.watcher`: the polling loop (sliding window, consecutive-window streak, bounded memory);
- :mod:`~specparity.watch.load`: the canary's own bounded prompt load, and the per-request figures it reads back;
- :mod:`~specparity.watch.view`: the live rich table with its sparkline, and the JSON lines;
- :mod:`~specparity.watch.rules`: Prometheus recording and alerting rules and a Grafana dashboard, in PromQL over the
  same metric names and the same band.

docs/watch.md is the user's page; the band's design is written there and in :mod:`~specparity.watch.band`.
"""
