"""Iris species from four flower measurements: a worked "bring your own model" module.

Registered in the Serve config's `args.models` as
`{name: iris, module: examples.iris_classifier, options: {seed: 0}}`, it is served at
`POST /models/iris/predict` with `{"inputs": [{"sepal_length_cm": 5.1, ...}, ...]}`.

The model is trained at start-up (each replica, in `load`) on the iris data set that ships
with scikit-learn: no download, a few milliseconds, deterministic for a given seed. A
stratified quarter of the data is held out and the held-out accuracy is logged and shown in
`/v1/models`; the model served is the one that accuracy measures.

scikit-learn is imported inside `load` and `predict` only: the ingress imports this module for
`Input` and `Output` (to validate requests) and never needs scikit-learn.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger("ray.serve")

#: the measurements, in the order of scikit-learn's `load_iris().data` columns
FEATURES = ("sepal_length_cm", "sepal_width_cm", "petal_length_cm", "petal_width_cm")

#: default options of `load` (the Serve config may override each)
DEFAULT_SEED = 0
DEFAULT_HELD_OUT_FRACTION = 0.25
DEFAULT_REGULARIZATION = 1.0
#: LogisticRegression's solver iterations: plenty for 4 standardised features (it converges in ~20)
MAX_SOLVER_ITERATIONS = 1000

#: a generous bound on any iris measurement, in cm (the largest in the data set is 7.9)
MAX_MEASUREMENT_CM = 100.0


class Input(BaseModel):
    """One flower's measurements, in centimetres."""

    model_config = ConfigDict(extra="forbid")

    sepal_length_cm: float = Field(..., gt=0, le=MAX_MEASUREMENT_CM, examples=[5.1])
    sepal_width_cm: float = Field(..., gt=0, le=MAX_MEASUREMENT_CM, examples=[3.5])
    petal_length_cm: float = Field(..., gt=0, le=MAX_MEASUREMENT_CM, examples=[1.4])
    petal_width_cm: float = Field(..., gt=0, le=MAX_MEASUREMENT_CM, examples=[0.2])


class Output(BaseModel):
    species: str = Field(..., description="The most probable species: setosa, versicolor or virginica.")
    confidence: float = Field(..., ge=0, le=1, description="Probability of `species`.")
    probabilities: dict[str, float] = Field(..., description="Probability of each species (they sum to 1).")
    within_training_range: bool = Field(
        ..., description="False when a measurement lies outside the range seen in training: the model "
        "extrapolates, so treat the answer with care.")


@dataclass
class IrisModel:
    pipeline: Any
    species: list[str]
    low_cm: Any
    high_cm: Any
    held_out_accuracy: float
    train_size: int
    held_out_size: int
    seed: int
    regularization: float


def load(seed: int = DEFAULT_SEED, held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
         regularization: float = DEFAULT_REGULARIZATION) -> IrisModel:
    """Train standardisation + multinomial logistic regression on a stratified split of iris."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if not 0 < held_out_fraction < 1:
        raise ValueError(f"held_out_fraction must be between 0 and 1, got {held_out_fraction!r}")
    if regularization <= 0:
        raise ValueError(f"regularization must be positive, got {regularization!r}")
    data = load_iris()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=held_out_fraction, random_state=seed, stratify=data.target)
    pipeline = make_pipeline(StandardScaler(),
                             LogisticRegression(C=regularization, max_iter=MAX_SOLVER_ITERATIONS))
    pipeline.fit(x_train, y_train)
    model = IrisModel(
        pipeline=pipeline, species=[str(s) for s in data.target_names],
        low_cm=x_train.min(axis=0), high_cm=x_train.max(axis=0),
        held_out_accuracy=float(pipeline.score(x_test, y_test)),
        train_size=len(x_train), held_out_size=len(x_test), seed=seed, regularization=regularization,
    )
    logger.info("iris classifier trained on %d flowers: held-out accuracy %.3f on %d (seed %d)",
                model.train_size, model.held_out_accuracy, model.held_out_size, seed)
    return model


def predict(model: IrisModel, inputs: list[Input]) -> list[Output]:
    """One batch: one matrix, one `predict_proba` call for every flower of every request in it."""
    import numpy as np

    x = np.array([[getattr(item, name) for name in FEATURES] for item in inputs], dtype=np.float64)
    probabilities = model.pipeline.predict_proba(x)
    inside = ((x >= model.low_cm) & (x <= model.high_cm)).all(axis=1)
    outputs = []
    for row, within in zip(probabilities, inside):
        best = int(row.argmax())
        outputs.append(Output(
            species=model.species[best], confidence=float(row[best]),
            probabilities={name: float(p) for name, p in zip(model.species, row)},
            within_training_range=bool(within),
        ))
    return outputs


def describe(model: IrisModel) -> dict[str, Any]:
    """What /v1/models shows about this model."""
    return {
        "dataset": "iris (scikit-learn's copy of Fisher's 150 flowers, 3 species)",
        "estimator": "StandardScaler + LogisticRegression",
        "species": model.species,
        "features": list(FEATURES),
        "held_out_accuracy": round(model.held_out_accuracy, 4),
        "train_size": model.train_size,
        "held_out_size": model.held_out_size,
        "seed": model.seed,
        "regularization": model.regularization,
    }
