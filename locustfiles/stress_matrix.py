"""Stress matrix: translation payloads of 1 and 16 records x one request every
0.5 s, 0.1 s and 0.01 s per user (start to start; back to back once answers take
longer than the pacing). One user class per cell; `--shape stress_matrix` (the
default for this file) runs the cells in turn, `--matrix-users` users each, for
`--cell-seconds` each. Per-cell stats are the rows named `/translation <n>rec @<p>s`
(and `... [shed]` for 503s); `report.py` turns them into the markdown table.

    locust -f locustfiles/stress_matrix.py --headless -H http://127.0.0.1:9527 \
        --cell-seconds 30 --csv reports/matrix --csv-full-history --slo-off
"""

from locust import task

import base
import shapes
from shapes import SelectedShape  # noqa: F401  (the --shape dispatcher)


def _cell_user(records: int, pacing: float) -> type:
    name = f"/translation {shapes.cell_tag(records, pacing)}"

    def send(self):
        self.translate(records, name=name)

    return type(shapes.cell_class_name(records, pacing), (base.ServeAppUser,), {
        "pacing": pacing,
        "tasks": [task(send)],
        "__module__": __name__,
        "__doc__": f"{records} record(s) per request, one request every {pacing} s.",
    })


for _records, _pacing in shapes.MATRIX_CELLS:
    _cls = _cell_user(_records, _pacing)
    globals()[_cls.__name__] = _cls
del _records, _pacing, _cls
