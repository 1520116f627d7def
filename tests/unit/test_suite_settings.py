"""How the suite runs decides no verdict: the settings tests/conftest.py gives every test."""

from __future__ import annotations

import os
import signal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_hypothesis_has_no_deadline_and_no_too_slow_check() -> None:
    """On a loaded machine an example may take seconds: the suite's profile has no deadline
    and does not fail a property because its data came slowly."""
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check


@given(st.integers())
def test_a_property_without_its_own_settings_gets_the_profile(x: int) -> None:
    assert settings().deadline is None


def test_the_shell_that_started_the_suite_leaves_no_mark() -> None:
    """SIGINT is not inherited ignored (a background job of a script) and no $COLUMNS/$LINES
    (pytest-xdist's workers set COLUMNS=80) narrows the CLI's tables."""
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    assert "COLUMNS" not in os.environ and "LINES" not in os.environ
