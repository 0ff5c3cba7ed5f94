"""An engine's Prometheus exposition, read with ``prometheus_client``'s own parser: samples by name, summed over the
label sets a server exports (vLLM labels each counter with ``model_name`` and ``engine``; several engines under data
parallelism each export their own series)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Scrape:
    """One read of ``/metrics``: sample name -> [(labels, value)]."""

    samples: Mapping[str, tuple[tuple[Mapping[str, str], float], ...]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return cls({k: tuple(v) for k, v in out.items()})

    def has(self, name: str) -> bool:
        return name in self.samples

    def total(self, name: str) -> float | None:
        """The sum over every series of ``name`` (None when the server exports no such sample)."""
        rows = self.samples.get(name)
        return None if rows is None else sum(v for _, v in rows)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``name`` summed per value of ``label`` (e.g. vLLM's per-position counter by ``position``)."""
        out: dict[str, float] = {}
        for labels, v in self.samples.get(name, ()):
            if label in labels:
                out[labels[label]] = out.get(labels[label], 0.0) + v
        return out
