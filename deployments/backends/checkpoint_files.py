"""What identifies a local checkpoint, for the caches of what is made from it (the ONNX export of the
embedding model, CTranslate2's conversion). No torch here: the ONNX engine serves without it."""

from __future__ import annotations

from pathlib import Path

#: its config and every weights file: shards and their index included (`model-00001-of-00002.safetensors`)
CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                    "pytorch_model*.bin", "pytorch_model.bin.index.json")


def weight_files(folder: Path) -> list[Path]:
    """The files of `folder` that identify its checkpoint, sorted."""
    return sorted({path for name in CHECKPOINT_FILES for path in folder.glob(name) if path.is_file()})


__all__ = ["CHECKPOINT_FILES", "weight_files"]
