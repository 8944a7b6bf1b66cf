"""Translation scenario: 1-record requests (3 in 4) and 16-record requests (1 in 4), en->pt.

    locust -f locustfiles/translation.py --headless -H http://127.0.0.1:9527 -u 4 -t 60s
    locust -f locustfiles/translation.py --headless -H ... --shape step_ramp
"""

from locust import task

import base
from shapes import SelectedShape  # noqa: F401  (the --shape dispatcher)


class TranslationUser(base.ServeAppUser):
    @task(3)
    def one_record(self):
        self.translate(1)

    @task(1)
    def sixteen_records(self):
        self.translate(16)
