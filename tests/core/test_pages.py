"""``small_pages``: numpy's huge-page advice is off inside the block, restored after."""
from __future__ import annotations

import pytest

from sabre_pg.core import pages


def _setter():
    setter = pages._hugepage_setter()
    if setter is None:
        pytest.skip("this numpy has no huge-page setting")
    return setter


@pytest.mark.parametrize("before", [True, False])
def test_small_pages_turns_the_advice_off_and_restores_it(before):
    setter = _setter()
    original = setter(before)
    try:
        with pages.small_pages():
            assert setter(False) is False           # (reads the current value: off)
        assert setter(before) is before             # restored
        with pytest.raises(RuntimeError):
            with pages.small_pages():
                raise RuntimeError("boom")
        assert setter(before) is before             # restored on an error too
    finally:
        setter(original)


def test_small_pages_nests():
    setter = _setter()
    original = setter(True)
    try:
        with pages.small_pages():
            with pages.small_pages():
                pass
            assert setter(False) is False
        assert setter(True) is True
    finally:
        setter(original)
