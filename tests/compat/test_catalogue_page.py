"""docs/catalogue.md is what the recorded whole-catalogue run generates, and that record covers every
resources server of the installed wheel; the servers `make test` runs live are recorded as agreeing."""
from __future__ import annotations

import pytest

from gymserve.nemo_gym.catalogue import recorded
from gymserve.nemo_gym.wheel import package_root, server_names
from tests.compat import catalogue_page
from tests.compat.test_nemo_gym_hosted import SUBSET

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym


def test_the_page_is_generated_from_the_record():
    assert catalogue_page.PAGE.read_text() == catalogue_page.render(), \
        "docs/catalogue.md is stale: python -c 'from tests.compat import catalogue_page; catalogue_page.write()'"


def test_every_server_of_the_wheel_has_a_line(nemo):
    assert sorted(recorded()) == server_names(package_root(nemo.venv))
    assert len(recorded()) == 145
    for name, result in recorded().items():
        assert result["runs_here"] or result["reason"], name  # never "does not run" without saying why


def test_the_live_subset_is_recorded_as_agreeing():
    results = recorded()
    for name in SUBSET:
        assert results[name]["runs_here"] and results[name]["agrees"] is True, results[name]
