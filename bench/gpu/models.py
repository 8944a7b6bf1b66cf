"""The models bench.gpu serves, built offline (random weights, real shapes) into .bench-models/.

* ``build_m2m100_sized``: M2M100ForConditionalGeneration with facebook/m2m100_418M's shape (d_model
  1024, 12+12 layers, 16 heads, FFN 4096, vocabulary 128,112, tied embeddings: 484M parameters) saved
  in float16 (0.97 GB), on tests/fixtures/tiny_models.py's M2M100 tokenizer with its vocabulary grown
  to the real one's 128,000 entries, so the 100 language tokens get the real ids (128,000-128,099), as
  bench/peers/models.py grows Marian's. Random weights never stop on their own: every caller fixes the
  decode length (min_new_tokens == max_new_tokens).
* ``build_minilm_shaped``: a random BertModel with all-MiniLM-L6-v2's config (6 layers, hidden 384,
  12 heads, FFN 1536, vocabulary 30,522) and a BERT WordPiece tokenizer from a generated vocab.txt;
  what `embeddings.model_path` takes (the real MiniLM package does not travel to the GPU machine).
* ``build_tiny_m2m100``: the test fixture itself, for `--tiny` runs on a CPU box.
"""

from __future__ import annotations

import json
import shutil
import string
import tempfile
import time
from pathlib import Path

from bench.gpu.common import ROOT, say

MODELS_DIR = ROOT / ".bench-models"
M2M100_SIZED = {"d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
                "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096}
M2M100_VOCAB = 128112  # facebook/m2m100_418M's config.vocab_size
M2M100_TEXT_VOCAB = 128000  # entries of its vocab.json; the 100 language tokens and 8 made-up words follow
MINILM_SHAPE = {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
                "intermediate_size": 1536, "max_position_embeddings": 512, "type_vocab_size": 2}
MARKER = "bench-shape.json"


def _built(folder: Path, shape: dict) -> bool:
    marker = folder / MARKER
    return marker.is_file() and json.loads(marker.read_text()) == shape


def build_m2m100_sized(device: str = "cuda", dtype_name: str = "float16") -> Path:
    """Write (once) the random M2M100-418M-sized model; returns its folder."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    from tests.fixtures.tiny_models import build_tiny_m2m100

    out = MODELS_DIR / "m2m100-418M-sized"
    shape = {**M2M100_SIZED, "vocab_size": M2M100_VOCAB, "dtype": dtype_name}
    if _built(out, shape):
        return out
    began = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_m2m100(tmp)
        vocab = json.loads((tiny / "vocab.json").read_text(encoding="utf-8"))
        for token_id in range(len(vocab), M2M100_TEXT_VOCAB):  # placeholder pieces, decoded like any other
            vocab[f"\u2581w{token_id}"] = token_id
        (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        shutil.copy(tiny / "sentencepiece.bpe.model", out / "sentencepiece.bpe.model")
        config = M2M100Config.from_pretrained(tiny)
        generation = GenerationConfig.from_pretrained(tiny)
    tokenizer = M2M100Tokenizer(vocab_file=str(out / "vocab.json"), spm_file=str(out / "sentencepiece.bpe.model"),
                                src_lang="en", tgt_lang="pt", model_max_length=1024)
    tokenizer.save_pretrained(out)
    lang_ids = [tokenizer.get_lang_id(code) for code in ("en", "pt")]
    assert min(lang_ids) >= M2M100_TEXT_VOCAB and max(lang_ids) < M2M100_VOCAB, lang_ids
    config.update({**M2M100_SIZED, "vocab_size": M2M100_VOCAB, "init_std": 0.02})
    torch.manual_seed(0)
    with torch.device(device):  # random init where it runs: seconds on a GPU
        model = M2M100ForConditionalGeneration(config)
    model = model.to(getattr(torch, dtype_name)).eval()
    model.generation_config = generation
    model.save_pretrained(out)
    (out / MARKER).write_text(json.dumps(shape))
    params = sum(p.numel() for p in model.parameters())
    say(f"built {out.name}: {params / 1e6:.0f}M parameters, {dtype_name}, in {time.perf_counter() - began:.1f} s")
    return out


def build_tiny_m2m100() -> Path:
    """The tiny M2M100 test fixture (float32), for --tiny runs."""
    from tests.fixtures.tiny_models import build_tiny_m2m100 as build

    out = MODELS_DIR / "tiny" / "tiny-m2m100"
    if (out / "model.safetensors").is_file():
        return out
    return build(out.parent)


def _wordpieces() -> list[str]:
    """[PAD] [UNK] [CLS] [SEP] [MASK], characters and ##characters, the benchmarks' words, then fillers."""
    from bench.load import POOL
    from tests.fixtures.sentences import SENTENCES, WORDS

    chars = string.ascii_lowercase + string.digits + string.punctuation
    words = {w.strip(string.punctuation).lower() for text in (*POOL, *SENTENCES) for w in text.split()}
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    for word in sorted(set(WORDS) | words):
        if word and word not in pieces:
            pieces.append(word)
    pieces += [f"w{i}" for i in range(len(pieces), MINILM_SHAPE["vocab_size"])]
    return pieces


def build_minilm_shaped() -> Path:
    """Write (once) the random MiniLM-shaped BERT with its WordPiece tokenizer; returns its folder."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    out = MODELS_DIR / "minilm-shaped"
    if _built(out, MINILM_SHAPE):
        return out
    began = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pieces = _wordpieces()
    (out / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    try:  # transformers 5: the tokenizers-backed class takes the vocabulary itself
        tokenizer = BertTokenizer(vocab={p: i for i, p in enumerate(pieces)}, do_lower_case=True,
                                  model_max_length=512)
    except TypeError:
        tokenizer = BertTokenizer(vocab_file=str(out / "vocab.txt"), do_lower_case=True, model_max_length=512)
    tokenizer.save_pretrained(out)
    config = BertConfig(**MINILM_SHAPE, pad_token_id=0)
    torch.manual_seed(0)
    BertModel(config).eval().save_pretrained(out)
    (out / MARKER).write_text(json.dumps(MINILM_SHAPE))
    say(f"built {out.name} (BERT {MINILM_SHAPE['num_hidden_layers']} layers, hidden {MINILM_SHAPE['hidden_size']}) "
        f"in {time.perf_counter() - began:.1f} s")
    return out


def build(device: str, tiny: bool) -> dict:
    """Both models for this run: {"translation": folder, "embeddings": folder}."""
    translation = build_tiny_m2m100() if tiny else build_m2m100_sized(device, "float16" if device != "cpu"
                                                                      else "float32")
    return {"translation": str(translation), "embeddings": str(build_minilm_shaped())}
