"""The stream entry point's pure pieces without a server: the outputs' columns and the row
order of a window read."""
from __future__ import annotations

import numpy as np
import pytest

from .fake_plpy import sabre_plpy
from .test_stages import INT4, INT8, TEXT, request

ST = sabre_plpy("stream")


def test_output_columns_extend_the_batch_output():
    req = request([("age", INT4, "numerical"), ("sex", TEXT, "categorical")], ("salary", INT8, "numerical"))
    out, classes = ST.output_columns(req)
    assert [c for c, _ in out] == ["ec_id", "age_lo", "age_hi", "sex", "salary", "advance_no", "window_first",
                                   "window_last", "published_at"]
    assert [c for c, _ in classes] == ["ec_id", "size", "emd", "age_lo", "age_hi", "sex", "advance_no",
                                       "window_first", "window_last", "published_at"]
    assert dict(out)["age_lo"] == "integer" and dict(out)["sex"] == "text" and dict(out)["salary"] == "bigint"


@pytest.mark.parametrize("integer", [True, False])
def test_row_order_puts_the_read_rows_in_row_order(integer):
    req = request([("age", INT4, "numerical")], ("salary", INT8, "numerical"))
    if not integer:
        req = req.__class__(**{**req.__dict__, "key": ST.request.Key("code", TEXT, True)})
    state = ["30", "10", "20", "40"]
    read = np.array([10, 20, 30, 40]) if integer else ["10", "20", "30", "40"]
    order = ST.row_order(req, state, read)
    assert [str(read[i]) for i in order] == state
