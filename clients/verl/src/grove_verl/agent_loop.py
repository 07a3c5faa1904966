"""`GroveTreeAgentLoop`: a verl agent loop (verl 0.9.1, `verl.experimental.agent_loop`) whose
rows grow Tree-GRPO trees in a Grove env-server.

verl's trainer repeats each prompt rollout.n times and expects one output per row, in order. Every
row of a prompt sends `JoinForest` with the same key (the prompt's uid); the env-server answers
each with a role: the initial chain of a tree, or an expansion that continues from a node of an
earlier chain, whose exact tokens the row rebuilds from the step data its predecessors stored
(`{"ids", "logprobs"}` of the generated tokens; observation text tokenised on its own). Rows may
run on any agent-loop worker: the forest lives in the env-server. See docs/forest-wire.md."""

import asyncio
import hashlib
import logging
import os
import time
from typing import Any

import msgpack
import numpy as np
from grove_client import AsyncClient
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from .advantage import TREE_COLUMN
from .config import GroveLoopConfig

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

CLIENT_NAME = "grove-verl/0.1.0"

# One env-server connection per (event loop, url, token): an agent-loop worker process runs all its
# rows on one loop, so this is one connection per worker, opened by the first row that needs it.
_CONNECTIONS: dict = {}
_CONNECT_LOCKS: dict = {}


async def connection(url, token=None, timeout=60.0):
    """The shared AsyncClient of this event loop for `url`, (re)connected when needed."""
    loop = asyncio.get_running_loop()
    key = (id(loop), url, token)
    entry = _CONNECTIONS.get(key)
    if entry is not None and entry[0] is loop and not entry[1].closed:
        return entry[1]
    lock = _CONNECT_LOCKS.get(key)
    if lock is None or lock[0] is not loop:
        lock = _CONNECT_LOCKS[key] = (loop, asyncio.Lock())
    async with lock[1]:
        entry = _CONNECTIONS.get(key)
        if entry is not None and entry[0] is loop and not entry[1].closed:
            return entry[1]
        client = await asyncio.wait_for(AsyncClient.connect(url, token=token, name=CLIENT_NAME), timeout)
        _CONNECTIONS[key] = (loop, client)
        return client


async def close_connections():
    """Disconnect the connections of the running event loop (tests; a worker never needs to)."""
    loop = asyncio.get_running_loop()
    for key, (owner, client) in list(_CONNECTIONS.items()):
        if owner is loop:
            del _CONNECTIONS[key]
            _CONNECT_LOCKS.pop(key, None)
            await client.disconnect()


def pack_step_data(ids, logprobs):
    """The step data Grove's agents store: the generated ids and their log-probs."""
    return msgpack.packb({"ids": [int(t) for t in ids], "logprobs": [float(x) for x in logprobs]}, use_bin_type=True)


def unpack_step_data(data):
    if data is None:
        raise ValueError("a prefix step has no data: it was not played by a Grove agent loop, its tokens are unknown")
    value = msgpack.unpackb(data, raw=False)
    ids, logprobs = list(value["ids"]), list(value["logprobs"])
    if len(ids) != len(logprobs):
        raise ValueError(f"step data holds {len(ids)} ids but {len(logprobs)} log-probs")
    return ids, logprobs


def forest_key(kwargs):
    """The key of a row's forest: its prompt's uid, and the training step where verl passes it
    (V1 trainer: `global_steps`), so that keys never repeat."""
    if "uid" not in kwargs:
        raise KeyError("GroveTreeAgentLoop needs the row's `uid` (verl's trainer sets it for every prompt)")
    key = str(kwargs["uid"])
    step = kwargs.get("global_steps")
    if step is not None:
        key = f"{key}@{int(step)}"
    return key


def forest_seed(seed, key):
    """A forest's seed: the configured seed and the key, hashed (the same in every process)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big")


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def task_from_row(kwargs):
    """The TaskSpec of a Search-R1 row: `question`, gold answers from
    `reward_model.ground_truth.target` (else a `golden_answers` column), `data_source`, `id`."""
    question = kwargs.get("question")
    if question is None:
        question = (kwargs.get("extra_info") or {}).get("question")
    if question is None:
        raise KeyError("the row has no `question` (Search-R1 parquet column) nor extra_info.question")
    gold = None
    reward_model = kwargs.get("reward_model")
    if isinstance(reward_model, dict):
        truth = reward_model.get("ground_truth")
        gold = truth.get("target") if isinstance(truth, dict) else truth
    if gold is None:
        gold = kwargs.get("golden_answers")
    if gold is None:
        raise KeyError("the row has no gold answers (reward_model.ground_truth.target or golden_answers)")
    if isinstance(gold, (str, bytes)):
        gold = [gold]
    task_id = kwargs.get("id")
    return {
        "question": str(_plain(question)),
        "golden_answers": [str(_plain(g)) for g in gold],
        "data_source": str(_plain(kwargs.get("data_source") or "nq")),
        "task_id": None if task_id is None else str(_plain(task_id)),
        "metric": None,
    }


class _Tokens:
    """A row's response so far: ids, loss mask and log-probs, aligned; `step_ends[s]` is the
    length after step s+1 (its observation included)."""

    def __init__(self):
        self.ids, self.mask, self.logprobs, self.step_ends = [], [], [], []

    def generated(self, ids, logprobs):
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += logprobs

    def observed(self, ids):
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def end_step(self):
        self.step_ends.append(len(self.ids))


@register("grove_tree")
class GroveTreeAgentLoop(AgentLoopBase):
    """Tree-GRPO (or chain GRPO) rollouts through a Grove env-server; settings in `grove`
    (see GroveLoopConfig). One output per row; `extra_fields` carry `tree_uid` for the
    `tree_grpo` estimator and the row's place in its forest."""

    def __init__(self, *args, grove=None, tools=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.grove = GroveLoopConfig.from_mapping(grove, rollout_n=self.rollout_config.n)
        self.response_length = self.rollout_config.response_length
        self.rollout_n = self.rollout_config.n

    # -- helpers -------------------------------------------------------------------------

    async def _prompt_ids(self, messages):
        """The prompt the way verl's own loops build it (the chat template of raw_prompt)."""
        if hasattr(self, "ct_build_initial_tokens"):  # verl >= 0.9
            return await self.ct_build_initial_tokens(messages)
        ids = await self.loop.run_in_executor(  # pragma: no cover - older verl
            None,
            lambda: self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs
            ),
        )
        return ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids

    def _observation_ids(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False)[: self.grove.max_obs_tokens]

    def _sampling_params(self, sampling_params, max_tokens):
        params = dict(sampling_params)
        params["stop"] = list(self.grove.stop)
        params["max_tokens"] = max_tokens
        params["logprobs"] = True  # the step data keeps them, whatever the trainer asked for
        if self.grove.keep_stop_strings:
            backend = getattr(self.rollout_config, "name", None)
            if backend == "vllm":
                params["include_stop_str_in_output"] = True
            elif backend == "sglang":
                params["no_stop_trim"] = True
        params.update(self.grove.extra_sampling_params)
        return params

    def _options(self):
        return {"max_turns": self.grove.max_turns, "topk": self.grove.topk, "backend": self.grove.backend}

    async def _finish_quietly(self, env, episode):
        """After a failure, end the row's chain with empty actions so that the rows waiting for
        it are not held until the forest expires. Best effort."""
        for _ in range(self.grove.max_turns + 2):
            try:
                obs = await env.step(episode, "", data=pack_step_data([], []))
            except Exception:
                return
            if obs["done"]:
                return

    # -- the loop ------------------------------------------------------------------------

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        cfg = self.grove
        messages = list(kwargs["raw_prompt"])
        prompt_ids = list(await self._prompt_ids(messages))
        task = task_from_row(kwargs)
        key = forest_key(kwargs)
        env = await connection(cfg.url, cfg.token(), cfg.connect_timeout_s)

        started = time.monotonic()
        greedy = float(sampling_params.get("temperature", 1.0)) == 0.0
        if greedy:
            # Greedy rows (verl's validation) are plain episodes: forks of a greedy policy repeat
            # each other, and validation may send fewer rows per prompt than a forest needs.
            [start] = await env.create_episodes([task], **self._options())
            role = {"key": key, "row": 0, "tree": 0, "round": 0, "episode": start["episode"], "from": None, "prefix": []}
        else:
            role = await env.join_forest(key, cfg.shape(self.rollout_n), forest_seed(cfg.seed, key), task, self._options())
        join_s = time.monotonic() - started
        episode = role["episode"]

        tokens = _Tokens()
        for step in role["prefix"]:
            ids, logprobs = unpack_step_data(step.get("data"))
            tokens.generated(ids, logprobs)
            tokens.observed(self._observation_ids(step["observation"]))
            tokens.end_step()
        prefix_tokens = len(tokens.ids)

        timing = {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1}
        has_logprobs = True
        filler_steps = 0
        request_id = f"{key}/{role['tree']}"
        reward = None
        try:
            while True:
                budget = self.response_length - len(tokens.ids)
                if budget <= 0:
                    # No room left: end the episode with empty actions (the row is truncated).
                    ids, logprobs, text = [], [], ""
                    filler_steps += 1
                else:
                    t0 = time.monotonic()
                    out = await self.server_manager.generate(
                        request_id=request_id,
                        prompt_ids=prompt_ids + tokens.ids,
                        sampling_params=self._sampling_params(sampling_params, min(cfg.max_tokens_per_turn, budget)),
                    )
                    timing["generate_sequences"] += time.monotonic() - t0
                    if out.num_preempted is not None:
                        timing["num_preempted"] = max(timing["num_preempted"], 0) + out.num_preempted
                    ids = list(out.token_ids)
                    if out.log_probs is not None and len(out.log_probs) == len(ids):
                        logprobs = [float(x) for x in out.log_probs]
                    else:
                        has_logprobs = False
                        logprobs = [0.0] * len(ids)
                    text = self.tokenizer.decode(ids, skip_special_tokens=True)
                t0 = time.monotonic()
                obs = await env.step(episode, text, data=pack_step_data(ids, logprobs))
                timing["tool_calls"] += time.monotonic() - t0
                tokens.generated(ids, logprobs)
                if obs["done"]:
                    tokens.end_step()
                    reward = obs["reward"]
                    break
                tokens.observed(self._observation_ids(obs["text"]))
                tokens.end_step()
        except BaseException:
            if reward is None:
                await self._finish_quietly(env, episode)
            raise
        finally:
            if greedy:
                try:
                    await env.close(episode, raise_errors=False)
                except Exception:
                    pass

        truncated = len(tokens.ids) > self.response_length or filler_steps > 0
        n = self.response_length
        from_node = role.get("from") or {}
        extra_fields = {
            TREE_COLUMN: f"{key}/{role['tree']}",
            "grove_key": key,
            "grove_row": int(role["row"]),
            "grove_tree": int(role["tree"]),
            "grove_round": int(role["round"]),
            "grove_episode": int(episode),
            "grove_from_episode": int(from_node.get("episode", -1)),
            "grove_from_step": int(from_node.get("step", -1)),
            "grove_prefix_tokens": prefix_tokens,
            "grove_step_ends": list(tokens.step_ends),
            "grove_truncated": bool(truncated),
            "grove_join_wait_s": join_s,
            "grove_reward": dict(reward),
            "turn_scores": [],
            "tool_rewards": [],
        }
        want_logprobs = bool(sampling_params.get("logprobs")) and has_logprobs
        if truncated:
            logger.warning("row %s of forest %s truncated to response_length=%d", role["row"], key, n)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=tokens.ids[:n],
            response_mask=tokens.mask[:n],
            response_logprobs=tokens.logprobs[:n] if want_logprobs else None,
            reward_score=float(reward["score"]),
            num_turns=2 * len(tokens.step_ends),  # the user turn, then each step's action and observation
            metrics=timing,
            extra_fields=extra_fields,
        )
