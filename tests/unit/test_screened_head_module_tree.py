"""`screened_generate` keeps its ScreenedLogits on the output projection without making it a submodule: it holds
the projection itself, so the model contained itself after the first screened `generate` (on CPUs with bfloat16
arithmetic) and `eval()`, `state_dict()` and `repr()` recursed without end. A stand-in screen here: this CPU
has no bfloat16 arithmetic for the real one (test_screened_head.py)."""

from __future__ import annotations

import torch

from deployments.backends import screened_head


class _DecidesNothing:
    """A screen that never decides (the full layer computes every logit): generate's answer is unchanged."""

    weight = torch.zeros(1, 1)

    def candidates(self, hidden, ban):
        return None


def test_the_model_does_not_contain_itself_after_a_screened_generate(monkeypatch, make_backend, tiny_marian_dir):
    monkeypatch.setattr(screened_head.ScreenedHead, "for_model", staticmethod(lambda model: _DecidesNothing()))
    backend = make_backend(tiny_marian_dir)  # its own model: the stand-in stays on its projection
    model = backend.model
    head = model.get_output_embeddings()
    ids, mask = backend._pad([[5, 9, 17, 0], [7, 3, 0]])
    with torch.inference_mode():
        expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False).tolist()
        with screened_head.screened_generate(model):
            got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False).tolist()
    assert got == expected and model.get_output_embeddings() is head
    assert isinstance(head._serve_app_logits, screened_head.ScreenedLogits)  # kept for the next call
    assert "_serve_app_logits" not in dict(head.named_children())
    model.eval()
    assert len(model.state_dict()) > 0 and "MarianMTModel" in repr(model)
