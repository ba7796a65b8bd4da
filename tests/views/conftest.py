"""Fixtures of the view tests."""

import pytest
from view_model import make_report


@pytest.fixture(scope="session")
def report():
    return make_report()


@pytest.fixture(scope="session")
def data(report):
    return report.to_dict()
