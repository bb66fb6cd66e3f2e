"""A gunicorn worker freezes the heap it made loading the app (settings/gunicorn.py
post_worker_init), so the collector's full passes walk only what requests made since."""

from __future__ import annotations

import requests


def test_a_worker_moves_its_start_up_heap_to_the_permanent_generation(probe_factory):
    probe = probe_factory()
    heap = requests.get(f"{probe.url}/probe/heap", timeout=10).json()
    # Django, DRF and the URLconf are tens of thousands of objects; a worker that froze
    # nothing reports 0.
    assert heap["frozen"] > 10_000, heap
    assert heap["frozen"] > heap["tracked"] / 2, heap
