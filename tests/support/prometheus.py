"""The operator's /metrics as the tests read it: one scrape over HTTP, parsed by prometheus-client.

A scrape is ``{(sample name, frozenset of its labels): value}``; :func:`value` reads one series (0
when absent, as Prometheus treats a counter never incremented), :func:`total` adds a name's series.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples | None:
    """The samples ``url`` serves now; None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def by_label(samples: Samples, name: str, label: str, **where: str) -> dict[str, float]:
    """``name``'s non-zero series whose labels include ``where``, by the value of ``label``."""
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        found = dict(labels)
        if n == name and v and all(found.get(k) == w for k, w in where.items()):
            out[found[label]] = v
    return out
