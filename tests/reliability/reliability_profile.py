"""Hypothesis profile of the reliability tests (imported by each of them; not a conftest.py, whose module name
would shadow tests/conftest.py for ``from conftest import ...``): a fixed example budget in CI, a larger one for a
nightly run.
Its own name (``coupled-qk-reliability``), so that tests/conftest.py, imported again by ``from tests.conftest import``,
cannot replace it with the base profile (which it did: every reliability test ran 100 random examples).

``COUPLED_QK_HYPOTHESIS_EXAMPLES=2000 pytest tests/reliability`` raises the budget (default 25 per test).
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "coupled-qk-reliability",
    max_examples=int(os.environ.get("COUPLED_QK_HYPOTHESIS_EXAMPLES", "25")),
    deadline=None,
    derandomize=os.environ.get("COUPLED_QK_HYPOTHESIS_EXAMPLES") is None,  # CI: the same examples every run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("coupled-qk-reliability")
