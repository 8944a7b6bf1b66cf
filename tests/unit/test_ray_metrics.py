"""tests/ray_metrics.py: the batch figures a bench cell reads from Ray's metrics endpoint (no Ray), from the exact
counters, not the histograms' _sum (which Ray exports from bucket midpoints: 0.5 here, whatever was observed)."""

from tests import ray_metrics

EXPOSITION = """\
# HELP ray_serve_app_batch_records Records in one model call.
# TYPE ray_serve_app_batch_records histogram
ray_serve_app_batch_records_bucket{{model="Translator",replica="a",le="+Inf"}} {a_count}
ray_serve_app_batch_records_count{{model="Translator",replica="a"}} {a_count}
ray_serve_app_batch_records_sum{{model="Translator",replica="a"}} 0.5
ray_serve_app_records_batched_total{{model="Translator",replica="a"}} {a_sum}
ray_serve_app_batch_records_bucket{{model="Translator",replica="b",le="+Inf"}} {b_count}
ray_serve_app_batch_records_count{{model="Translator",replica="b"}} {b_count}
ray_serve_app_batch_records_sum{{model="Translator",replica="b"}} 0.5
ray_serve_app_records_batched_total{{model="Translator",replica="b"}} {b_sum}
ray_serve_app_batch_records_bucket{{model="Embedder",replica="c",le="+Inf"}} 7
ray_serve_app_batch_records_count{{model="Embedder",replica="c"}} 7
ray_serve_app_batch_records_sum{{model="Embedder",replica="c"}} 700
ray_serve_app_records_batched_total{{model="Embedder",replica="c"}} 700
# HELP ray_serve_app_model_seconds Model time of one batch, in seconds.
# TYPE ray_serve_app_model_seconds histogram
ray_serve_app_model_seconds_bucket{{model="Translator",replica="a",le="+Inf"}} {a_count}
ray_serve_app_model_seconds_count{{model="Translator",replica="a"}} {a_count}
ray_serve_app_model_seconds_sum{{model="Translator",replica="a"}} 0.5
ray_serve_app_model_busy_seconds_total{{model="Translator",replica="a"}} {a_s}
"""


def reading(a_count, a_sum, b_count, b_sum, a_s):
    return ray_metrics.parse(EXPOSITION.format(a_count=a_count, a_sum=a_sum, b_count=b_count, b_sum=b_sum, a_s=a_s))


def test_batch_figures_sum_replicas_of_one_model_and_ignore_others():
    before = reading(10, 100, 5, 40, 20.0)
    after = reading(14, 180, 9, 120, 30.0)  # +8 batches, +160 records, +10 model seconds
    figures = ray_metrics.batch_figures(before, after, "Translator")
    assert figures == {"batches": 8, "records": 160, "records_per_batch": 20.0,
                       "model_s_per_batch": 1.25, "model_records_per_s": 16.0}


def test_batch_figures_without_batches():
    same = reading(3, 30, 0, 0, 1.0)
    assert ray_metrics.batch_figures(same, same, "Translator") == {"batches": 0}
    assert ray_metrics.batch_figures(same, same, "Model.iris") == {"batches": 0}
