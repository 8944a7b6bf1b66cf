"""Embeddings scenario: one input as a string (3 in 4) and 16 inputs as a list (1 in 4).

    locust -f locustfiles/embeddings.py --headless -H http://127.0.0.1:9527 -u 4 -t 60s
"""

from locust import task

import base
from shapes import SelectedShape  # noqa: F401  (the --shape dispatcher)


class EmbeddingsUser(base.ServeAppUser):
    @task(3)
    def one_input(self):
        self.embed(1)

    @task(1)
    def sixteen_inputs(self):
        self.embed(16)
