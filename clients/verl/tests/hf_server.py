"""A stand-in for verl's inference server: an object with the `generate` of verl's
`LLMServerClient` (verl 0.9.1, verl/workers/rollout/llm_server.py), answering verl's real
`TokenOutput`, implemented by a transformers model on the CPU.

It samples (temperature, top_p, top_k) from a seeded generator, stops at the model's end of
sequence, at `max_tokens`, or once the decoded output contains one of `stop` (the stop string is
kept, as vLLM's `include_stop_str_in_output` / SGLang's `no_stop_trim` do), and returns the
log-prob of each sampled token under the model's raw distribution (vLLM's default). One model
call at a time, on a worker thread, so the event loop keeps serving the env-server connection."""

import asyncio
import concurrent.futures
import threading

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.workers.rollout.replica import TokenOutput


class TransformersServer:
    def __init__(self, model_dir, seed=0, threads=1):
        torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.eos = {self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id} - {None}
        self.generator = torch.Generator().manual_seed(seed)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.lock = threading.Lock()
        self.calls = []  # (request_id, prompt length, sampling params, output length)

    async def generate(
        self,
        request_id,
        *,
        prompt_ids,
        sampling_params,
        image_data=None,
        video_data=None,
        audio_data=None,
        mm_processor_kwargs=None,
        **kwargs,
    ):
        params = dict(sampling_params)
        loop = asyncio.get_running_loop()
        ids, logprobs, reason = await loop.run_in_executor(self.pool, self._sample, list(prompt_ids), params)
        self.calls.append((request_id, len(prompt_ids), params, len(ids)))
        return TokenOutput(
            token_ids=ids,
            log_probs=logprobs if params.get("logprobs") else None,
            stop_reason=reason,
            num_preempted=0,
        )

    def _sample(self, prompt_ids, params):
        max_tokens = int(params.get("max_tokens") or params.get("max_new_tokens") or 64)
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1) or -1)
        stops = list(params.get("stop") or [])
        ids, logprobs = [], []
        with self.lock, torch.no_grad():
            out = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
            for _ in range(max_tokens):
                logits = out.logits[0, -1].float()
                logp = torch.log_softmax(logits, dim=-1)
                if temperature == 0.0:
                    token = int(torch.argmax(logits))
                else:
                    scaled = logits / temperature
                    if top_k > 0:
                        kth = torch.topk(scaled, top_k).values[-1]
                        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
                    probs = torch.softmax(scaled, dim=-1)
                    if top_p < 1.0:
                        sorted_probs, order = torch.sort(probs, descending=True)
                        drop = torch.cumsum(sorted_probs, 0) - sorted_probs > top_p
                        sorted_probs[drop] = 0.0
                        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
                    token = int(torch.multinomial(probs, 1, generator=self.generator))
                ids.append(token)
                logprobs.append(float(logp[token]))
                if token in self.eos:
                    return ids, logprobs, "completed"
                if stops:
                    text = self.tokenizer.decode(ids, skip_special_tokens=True)
                    if any(s in text for s in stops):
                        return ids, logprobs, "completed"
                out = self.model(
                    input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True
                )
        return ids, logprobs, "length"
