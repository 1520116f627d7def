"""How the suite runs decides no verdict: the settings tests/conftest.py gives every test."""

from __future__ import annotations

import os
import signal

import pytest
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


def test_the_ray_folder_is_one_scope_for_xdist(pytestconfig: pytest.Config) -> None:
    """Under --dist loadscope the distributed tier goes to one worker whole (one Ray instance);
    other tests are dealt out by module as xdist does."""
    pytest.importorskip("xdist")
    from tests.conftest import pytest_xdist_make_scheduler

    class Loadscope:  # the suite's own config, as `-n 2 --dist loadscope` would set it
        def __getattr__(self, name: str) -> object:
            return getattr(pytestconfig, name)

        def getoption(self, name: str, default: object = None) -> object:
            return "loadscope" if name == "dist" else pytestconfig.getoption(name, default)

        def getvalue(self, name: str) -> object:
            return {"numprocesses": 2, "tx": ["2*popen"]}.get(name, pytestconfig.getvalue(name))

    sched = pytest_xdist_make_scheduler(Loadscope(), None)  # type: ignore[arg-type]
    split = sched._split_scope  # type: ignore[union-attr]
    ray = "tests/integration/distributed/"
    assert split(ray + "test_ray_generate.py::a") == split(ray + "test_ray_hidden.py::b") == ray
    assert split("tests/unit/test_mix.py::test_x") == "tests/unit/test_mix.py"
    assert split("tests/unit/test_mix.py::Cls::test_x") == "tests/unit/test_mix.py::Cls"
