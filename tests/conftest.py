"""Test-suite settings: hypothesis profiles and the ``slow`` marker.

Profiles, chosen by ``DISTIR_HYPOTHESIS_PROFILE`` (default ``ci``):
- ``ci``: thorough — hypothesis's default number of examples, each test's own ``@settings`` as
  written; no deadline (a loaded machine is no failure). CI and ``./dev test`` run it.
- ``dev``: the fast loop (``./dev test-fast``) — every property test runs at most
  ``DEV_MAX_EXAMPLES`` examples, whatever its ``@settings`` ask for.

``slow`` (registered in pyproject.toml) marks the slowest tests; ``./dev test-fast`` deselects
them (``-m "not slow"``), ``./dev test`` runs everything. Under pytest-xdist the tests marked
``slow`` run first, then the property tests (under ``ci`` they run hundreds of examples), then the
rest, each group in collection order: a long test handed out last keeps one worker busy while the
others stand idle. ``./dev`` runs ``--dist loadgroup``: every test is a unit of its own, handed
out in this order to whichever worker has at most two tests left. The tests sharing an expensive
module or session fixture carry one ``xdist_group`` (one unit, on one worker), which takes effect
where pytest-xdist's rewrite of a test's ``_nodeid`` reaches pytest: not with pytest 9.2 and
pytest-xdist 3.8, where those tests are handed out alone too.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

DEV_MAX_EXAMPLES = 4

settings.register_profile("ci", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "dev", deadline=None, max_examples=DEV_MAX_EXAMPLES, suppress_health_check=[HealthCheck.too_slow]
)
PROFILE = os.environ.get("DISTIR_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the ``slow`` tests first, then the property tests; under ``dev``, cap the
    examples of property tests whose ``@settings`` ask for more."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_long_first)  # stable: each group keeps its collection order
    if PROFILE != "dev":
        return
    for item in items:
        fn = getattr(item, "obj", None)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is not None and own.max_examples > DEV_MAX_EXAMPLES:
            fn._hypothesis_internal_use_settings = settings(own, max_examples=DEV_MAX_EXAMPLES)  # type: ignore[union-attr]


def _long_first(item: pytest.Item) -> tuple[bool, bool]:
    """The sort key putting the ``slow`` tests first and the property tests next."""
    is_property = getattr(getattr(item, "obj", None), "is_hypothesis_test", False)
    return item.get_closest_marker("slow") is None, not is_property
