"""The hand-built 8-scenario gap run with the dose rider's rows and probes (tests/helpers.py: write_dose_run)."""

import pytest

from tests.helpers import write_dose_run


@pytest.fixture
def dose_run(tmp_path):
    return write_dose_run(tmp_path / "run")
