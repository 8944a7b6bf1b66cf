"""Mixed scenario: what a busy client mix looks like, both endpoints on the same users.

Per request: translation 1 record 30 %, translation 16 records 10 %,
embeddings 1 input 45 %, embeddings 16 inputs 15 %.

    locust -f locustfiles/mixed.py --headless -H http://127.0.0.1:9527 -u 4 -t 60s
"""

from locust import task

import base
from shapes import SelectedShape  # noqa: F401  (the --shape dispatcher)


class MixedUser(base.ServeAppUser):
    @task(6)
    def translate_one(self):
        self.translate(1)

    @task(2)
    def translate_sixteen(self):
        self.translate(16)

    @task(9)
    def embed_one(self):
        self.embed(1)

    @task(3)
    def embed_sixteen(self):
        self.embed(16)
