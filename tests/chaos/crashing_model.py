"""A model module whose replica process dies on the input "poison", as on a segfault or the OOM killer
(tests/chaos/test_crashing_input.py). Each death first appends a line to `deaths_file`, so the test counts them."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

#: the request body of the input it dies on
POISON = {"inputs": [{"text": "poison"}]}


def deaths(path: Path) -> int:
    """Replica processes that died of the poison so far (one line each in `deaths_file`)."""
    return len(path.read_text().splitlines()) if path.exists() else 0


class Input(BaseModel):
    text: str


class Output(BaseModel):
    text: str


def load(deaths_file: str) -> str:
    return deaths_file


def predict(model: str, inputs: list[Input]) -> list[Output]:
    if any(item.text == "poison" for item in inputs):
        with open(model, "a") as deaths:
            deaths.write(f"{os.getpid()}\n")
        os._exit(1)
    return [Output(text=item.text.upper()) for item in inputs]
