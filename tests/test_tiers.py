"""The test tiers `tests/conftest.py` sets: what they name exists, and `make test` runs every test not marked slow
exactly once."""

import re
from pathlib import Path

from tests.conftest import INTEGRATION, SERIAL

ROOT = Path(__file__).resolve().parents[1]


def test_the_modules_the_tiers_name_exist_and_each_serial_one_is_in_the_integration_tier():
    for where in INTEGRATION + SERIAL:
        assert (ROOT / where).exists(), where
    for where in SERIAL:
        assert where.startswith(INTEGRATION) or "mark.ray" in (ROOT / where).read_text(), where


def test_make_test_selects_each_test_once():
    makefile = (ROOT / "Makefile").read_text()
    selections = re.findall(r'pytest -m "(not slow and [^"]+)"', makefile)
    assert sorted(selections) == ["not slow and integration and not serial", "not slow and not integration",
                                  "not slow and serial"]
    assert re.search(r"^test: test-unit test-integration$", makefile, re.M)
