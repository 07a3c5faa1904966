"""HF transformers on the figures `trainer bench` measures, for the GPU check's side-by-side table:
greedy generation with a KV cache at several batch sizes, prefill, and one training step of the
mean token log-probability, timed with device syncs. Written for Grove (`cargo xtask gpu-check`
copies it into the folder that travels).

The training step includes the optimiser, as Grove's does: by default AdamW over f32 master
weights with bf16 autocast (weights, gradients and both moments in f32: 16 bytes per parameter,
the same as Grove's default `stochastic-rounding` state), `--optimizer none` for forward and
backward alone. The last line gives torch's peak allocated / reserved memory over the step.

usage: hf_bench.py MODEL_DIR [--new-tokens N] [--prompt-len P] [--gen-batches 1,8,64]
                   [--train-batch B] [--train-len T] [--only-train] [--optimizer adamw|none]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--new-tokens", type=int, default=64)
ap.add_argument("--prompt-len", type=int, default=32)
ap.add_argument("--gen-batches", default="1,8,64")
ap.add_argument("--train-batch", type=int, default=4)
ap.add_argument("--train-len", type=int, default=256)
ap.add_argument("--only-train", action="store_true")
ap.add_argument("--optimizer", choices=["adamw", "none"], default="adamw")
args = ap.parse_args()

cuda = torch.cuda.is_available()
device = "cuda" if cuda else "cpu"
low = torch.bfloat16 if cuda else torch.float32
gen = torch.Generator().manual_seed(0)


def sync():
    if cuda:
        torch.cuda.synchronize()


def emit(figure, value, unit, note):
    print(json.dumps({"figure": figure, "value": round(value, 1), "unit": unit, "note": note}), flush=True)


def random_ids(vocab, b, t):
    return torch.randint(1, vocab, (b, t), generator=gen).to(device)


def timed(f):
    sync()
    start = time.perf_counter()
    out = f()
    sync()
    return out, time.perf_counter() - start


if not args.only_train:
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=low).to(device).eval()
    vocab = model.config.vocab_size
    for b in [int(x) for x in args.gen_batches.split(",") if x]:
        prompt = random_ids(vocab, b, args.prompt_len)
        kw = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt))
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up at this shape
            out, secs = timed(lambda: model.generate(
                prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **kw))
        made = (out.shape[1] - args.prompt_len) * b
        emit(f"generation, batch {b}", made / secs, "tokens/s",
             f"HF generate greedy, {args.prompt_len} prompt + {args.new_tokens} new")
    with torch.no_grad():
        model(random_ids(vocab, 1, 16))
        x = random_ids(vocab, 8, 256)
        _, secs = timed(lambda: model(x, logits_to_keep=1))
    emit("prefill", 8 * 256 / secs, "tokens/s", "batch 8 x 256, no grad")
    del model
    if cuda:
        torch.cuda.empty_cache()

# Training: f32 master weights under bf16 autocast when an optimiser steps (the usual HF mixed
# precision); the compute dtype alone otherwise.
adam = args.optimizer == "adamw"
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32 if adam else low).to(device).train()
vocab = model.config.vocab_size
opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda) if adam else None


def step(b, t):
    x = random_ids(vocab, b, t)
    with torch.autocast(device_type=device, dtype=low, enabled=adam and cuda):
        loss = model(x, labels=x).loss  # mean token NLL over b x (t - 1), as trainer bench scores
    loss.backward()
    if opt is not None:
        opt.step()
    model.zero_grad(set_to_none=True)


step(1, 32)  # warm-up; AdamW's moments exist from here on, as they do in a training run
sync()
if cuda:
    torch.cuda.reset_peak_memory_stats()
_, secs = timed(lambda: step(args.train_batch, args.train_len))
what = ("forward + backward + AdamW step (f32 master" + (", bf16 autocast)" if cuda else ")")) if adam \
    else "forward + backward"
emit("training forward+backward", args.train_batch * args.train_len / secs, "tokens/s",
     f"HF batch {args.train_batch} x {args.train_len}, {what}")
if cuda:
    print(json.dumps({"peak_allocated_mib": torch.cuda.max_memory_allocated() // 2**20,
                      "peak_reserved_mib": torch.cuda.max_memory_reserved() // 2**20,
                      "optimizer": args.optimizer}), flush=True)
