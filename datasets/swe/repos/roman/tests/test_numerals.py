import pytest

from numerals import to_roman


def test_additive():
    assert to_roman(2023) == "MMXXIII"


def test_range():
    with pytest.raises(ValueError):
        to_roman(0)
