"""The stream entry point's pure pieces without a server: the outputs' columns and the row
order of a window read."""
from __future__ import annotations

import numpy as np

from .fake_plpy import sabre_plpy
from .test_stages import INT4, INT8, TEXT, request

ST = sabre_plpy("stream.stream")


def test_output_columns_extend_the_batch_output():
    req = request([("age", INT4, "numerical"), ("sex", TEXT, "categorical")], ("salary", INT8, "numerical"))
    out, classes = ST.output_columns(req)
    assert [c for c, _ in out] == ["ec_id", "age_lo", "age_hi", "sex", "salary", "advance_no", "window_first",
                                   "window_last", "published_at"]
    assert [c for c, _ in classes] == ["ec_id", "size", "emd", "age_lo", "age_hi", "sex", "advance_no",
                                       "window_first", "window_last", "published_at"]
    assert dict(out)["age_lo"] == "integer" and dict(out)["sex"] == "text" and dict(out)["salary"] == "bigint"


def test_row_order_puts_the_read_rows_in_row_order():
    window = ST.W.Window(11, 4, 2)
    read = np.array([13, 11, 12, 14])
    order = ST.row_order(window, read)
    assert read[order].tolist() == [11, 12, 13, 14]
    assert ST.row_order(window, np.array([13, 11, 14])) is None          # a row missing
    assert ST.row_order(window, np.array([13, 11, 12, 15])) is None      # not the window's
