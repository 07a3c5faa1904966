"""GroveTreeAgentLoop without an env-server or a model: verl's real config, dataset rows and
agent-loop construction, with a scripted env-server connection and a scripted inference server.
Checks the token bookkeeping (prefix rebuilt from step data, masks, log-probs, truncation), the
step data sent, and the configuration errors."""

import asyncio

import msgpack
import pytest
from hydra.errors import InstantiationException
from transformers import AutoTokenizer
from verl.workers.rollout.replica import TokenOutput

import grove_verl.agent_loop as agent_loop
from grove_verl.agent_loop import forest_key, forest_seed, pack_step_data, task_from_row, unpack_step_data
from grove_verl.config import GroveLoopConfig
from verl_setup import gen_batch, make_loop, row_kwargs, sampling_params, trainer_config, write_loops_yaml

SEARCH = "<think>I need the designer.</think><search> Elmsworth Harbor Bridge </search>"
ANSWER = "<think>Found it.</think><answer> Ada Kerrigan </answer>"
INFO = "\n\n<information>Doc 1(Title: \"Elmsworth Harbor Bridge\") It was designed by Ada Kerrigan.</information>\n\n"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


class ScriptedGen:
    """Answers each generate call with the next scripted text's tokens and made-up log-probs."""

    def __init__(self, tokenizer, texts, fail_at=None):
        self.tokenizer, self.texts, self.fail_at = tokenizer, list(texts), fail_at
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        if self.fail_at is not None and len(self.calls) > self.fail_at:
            raise RuntimeError("inference server down")
        ids = self.tokenizer.encode(self.texts[(len(self.calls) - 1) % len(self.texts)], add_special_tokens=False)
        ids = ids[: sampling_params["max_tokens"]]
        logprobs = [-0.25 * (i + 1) - len(self.calls) for i in range(len(ids))]
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")


class ScriptedEnv:
    """An env-server connection whose episodes end (with score 0.5) at step `done_at`."""

    def __init__(self, role, done_at=2):
        self.role, self.done_at = role, done_at
        self.steps, self.joins, self.created, self.closed_eps = [], [], [], []
        self.counts = {}

    async def join_forest(self, key, shape, seed, task, options=None):
        self.joins.append((key, shape, seed, task, options))
        return dict(self.role, key=key)

    async def create_episodes(self, tasks, **options):
        self.created.append((tasks, options))
        return [{"episode": 99, "prompt": "p", "max_turns": options["max_turns"]}]

    async def close(self, *episodes, raise_errors=True):
        self.closed_eps += episodes
        return list(episodes)

    async def step(self, episode, act, data=None):
        self.steps.append((episode, act, data))
        n = self.counts[episode] = self.counts.get(episode, len(self.role["prefix"])) + 1
        done = n >= self.done_at
        reward = {"score": 0.5, "metric": "em", "metric_value": 0.0, "answer": None, "format_valid": False}
        return {"episode": episode, "step": n, "kind": "invalid", "text": "" if done else INFO, "done": done,
                "reward": reward if done else None}


def role(prefix=(), tree=1, round_=0, episode=7, from_=None):
    return {"row": 4, "tree": tree, "round": round_, "episode": episode, "prompt": "p", "max_turns": 3,
            "from": from_, "prefix": list(prefix)}


@pytest.fixture
def setup(tmp_path, smollm2_dir, tokenizer, monkeypatch):
    def make(env, gen, n=6, response_length=1024, **grove):
        loops = write_loops_yaml(tmp_path / "loops.yaml", "ws://127.0.0.1:1/", **grove)
        config = trainer_config(smollm2_dir, n, loops, response_length=response_length)

        async def fake_connection(url, token=None, timeout=60.0):
            return env

        monkeypatch.setattr(agent_loop, "connection", fake_connection)
        rows = row_kwargs(gen_batch(config, tokenizer))
        make_loop(config, loops, gen, tokenizer)  # settings errors show at construction

        def run(params, row=0):
            """Build the loop inside the event loop (AgentLoopBase keeps the running loop, as
            AgentLoopWorker builds it in its own) and run one row."""

            async def main():
                return await make_loop(config, loops, gen, tokenizer).run(params, **rows[row])

            return asyncio.run(main())

        return config, run, rows

    return make


def test_a_root_row(setup, tokenizer):
    env, gen = ScriptedEnv(role()), ScriptedGen(tokenizer, [SEARCH, ANSWER])
    config, run, rows = setup(env, gen)
    out = run(sampling_params(config))
    s1 = tokenizer.encode(SEARCH, add_special_tokens=False)
    a2 = tokenizer.encode(ANSWER, add_special_tokens=False)
    obs = tokenizer.encode(INFO, add_special_tokens=False)
    assert out.response_ids == s1 + obs + a2
    assert out.response_mask == [1] * len(s1) + [0] * len(obs) + [1] * len(a2)
    lp1 = [-0.25 * (i + 1) - 1 for i in range(len(s1))]
    lp2 = [-0.25 * (i + 1) - 2 for i in range(len(a2))]
    assert out.response_logprobs == lp1 + [0.0] * len(obs) + lp2
    assert out.reward_score == 0.5 and out.num_turns == 4
    # The prompt is verl's chat template of the row's raw_prompt.
    messages = list(rows[0]["raw_prompt"])
    assert out.prompt_ids == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    # What the env-server got: the decoded text, and the exact ids and log-probs as step data.
    assert [a for _, a, _ in env.steps] == [tokenizer.decode(s1), tokenizer.decode(a2)]
    assert [unpack_step_data(d) for _, _, d in env.steps] == [(s1, lp1), (a2, lp2)]
    # The forest: key = uid, the tree's request id, shape from the settings, the row's task.
    key, shape, seed, task, options = env.joins[0]
    assert key == str(rows[0]["uid"]) and shape == (2, 2, 1, 3) and seed == forest_seed(0, key)
    assert task["golden_answers"] == ["Ada Kerrigan", "A. Kerrigan"] and task["data_source"] == "nq"
    assert options == {"max_turns": 3, "topk": 3, "backend": None}
    assert {c[0] for c in gen.calls} == {f"{key}/1"}
    params = gen.calls[0][2]
    assert params["stop"] == ["</search>", "</answer>"] and params["include_stop_str_in_output"] is True
    assert params["max_tokens"] == 500 and params["logprobs"] is True
    assert gen.calls[1][1] == out.prompt_ids + s1 + obs  # the second turn continues the context
    extra = out.extra_fields
    assert extra["tree_uid"] == f"{key}/1" and extra["grove_round"] == 0 and extra["grove_episode"] == 7
    assert extra["grove_prefix_tokens"] == 0 and extra["grove_step_ends"] == [len(s1) + len(obs), len(out.response_ids)]
    assert extra["grove_from_episode"] == -1 and extra["grove_truncated"] is False


def test_a_continuation_rebuilds_its_prefix_from_step_data(setup, tokenizer):
    ids_a, lps_a = [1, 2, 3, 400, 5000], [-0.5, -1.0, -0.125, -3.0, -0.0625]
    prefix = [{"action": "a", "observation": INFO, "data": pack_step_data(ids_a, lps_a)},
              {"action": "b", "observation": "\nMy previous action is invalid.\n", "data": pack_step_data([7], [-2.5])}]
    env = ScriptedEnv(role(prefix, round_=1, episode=11, from_={"episode": 7, "step": 2}), done_at=3)
    gen = ScriptedGen(tokenizer, [ANSWER])
    config, run, rows = setup(env, gen, max_obs_tokens=8)
    out = run(sampling_params(config))
    obs1 = tokenizer.encode(INFO, add_special_tokens=False)[:8]
    obs2 = tokenizer.encode("\nMy previous action is invalid.\n", add_special_tokens=False)[:8]
    head = ids_a + obs1 + [7] + obs2
    assert out.response_ids[: len(head)] == head
    assert out.response_mask[: len(head)] == [1] * 5 + [0] * len(obs1) + [1] + [0] * len(obs2)
    assert out.response_logprobs[: len(head)] == lps_a + [0.0] * len(obs1) + [-2.5] + [0.0] * len(obs2)
    assert gen.calls[0][1] == out.prompt_ids + head
    assert len(env.steps) == 1 and out.reward_score == 0.5
    extra = out.extra_fields
    assert extra["grove_prefix_tokens"] == len(head) and extra["grove_step_ends"][:2] == [5 + len(obs1), len(head)]
    assert (extra["grove_from_episode"], extra["grove_from_step"], extra["grove_round"]) == (7, 2, 1)


def test_a_prefix_step_without_data_is_an_error(setup, tokenizer):
    prefix = [{"action": "a", "observation": INFO}]
    env = ScriptedEnv(role(prefix, round_=1, from_={"episode": 7, "step": 1}))
    config, run, rows = setup(env, ScriptedGen(tokenizer, [ANSWER]))
    with pytest.raises(ValueError, match="no data"):
        run(sampling_params(config))


def test_rows_truncate_at_response_length_and_still_end_their_episode(setup, tokenizer):
    env, gen = ScriptedEnv(role(), done_at=4), ScriptedGen(tokenizer, [SEARCH])
    config, run, rows = setup(env, gen, response_length=30)
    out = run(sampling_params(config))
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) == 30
    assert out.extra_fields["grove_truncated"] is True
    # Once no room was left, the remaining steps were empty actions with empty data.
    assert len(env.steps) == 4 and env.steps[-1][1] == "" and unpack_step_data(env.steps[-1][2]) == ([], [])
    assert all(c[2]["max_tokens"] <= 30 for c in gen.calls)


def test_greedy_rows_play_plain_episodes(setup, tokenizer):
    env, gen = ScriptedEnv(role()), ScriptedGen(tokenizer, [ANSWER])
    config, run, rows = setup(env, gen)
    params = dict(sampling_params(config), temperature=0.0)
    out = run(params)
    assert env.joins == [] and len(env.created) == 1 and env.closed_eps == [99]
    assert out.extra_fields["grove_episode"] == 99 and out.reward_score == 0.5


def test_a_failing_row_ends_its_chain_before_raising(setup, tokenizer):
    env, gen = ScriptedEnv(role(), done_at=3), ScriptedGen(tokenizer, [SEARCH], fail_at=1)
    config, run, rows = setup(env, gen)
    with pytest.raises(RuntimeError, match="inference server down"):
        run(sampling_params(config))
    assert [a for _, a, _ in env.steps][1:] == ["", ""]  # filler steps until the episode ended


def test_chain_mode_joins_one_tree_per_row(setup, tokenizer):
    env, gen = ScriptedEnv(role()), ScriptedGen(tokenizer, [ANSWER])
    config, run, rows = setup(env, gen, n=4, mode="chain")
    run(sampling_params(config))
    assert env.joins[0][1] == (4, 0, 0, 1)


def test_configuration_errors(setup, tokenizer):
    # verl builds the loop through hydra, which wraps the ValueError in InstantiationException.
    env, gen = ScriptedEnv(role()), ScriptedGen(tokenizer, [ANSWER])
    with pytest.raises(InstantiationException, match="unknown grove settings \\['mtree'\\]"):
        setup(env, gen, mtree=3)
    with pytest.raises(InstantiationException, match="rollout.n is 4"):
        setup(env, gen, n=4)
    with pytest.raises(InstantiationException, match="k must be 1 \\+ n\\*l"):
        setup(env, gen, k=4, n=2, l=1)
    with pytest.raises(ValueError, match="mode"):
        GroveLoopConfig.from_mapping({"url": "ws://x/", "mode": "forest"})
    with pytest.raises(ValueError, match="needs its settings"):
        GroveLoopConfig.from_mapping(None)
    with pytest.raises(ValueError, match="url"):
        GroveLoopConfig.from_mapping({"mode": "tree"})


def test_row_helpers():
    row = {
        "uid": "u-1",
        "question": "who?",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["A", "B"]}},
        "data_source": "hotpotqa",
        "id": "train_3",
    }
    assert task_from_row(row) == {"question": "who?", "golden_answers": ["A", "B"], "data_source": "hotpotqa",
                                  "task_id": "train_3", "metric": None}
    assert forest_key(row) == "u-1" and forest_key(dict(row, global_steps=12)) == "u-1@12"
    assert forest_seed(0, "u-1") == forest_seed(0, "u-1") != forest_seed(1, "u-1")
    data = pack_step_data([1, 2], [-0.5, -1.5])
    assert msgpack.unpackb(data) == {"ids": [1, 2], "logprobs": [-0.5, -1.5]}
    with pytest.raises(KeyError):
        forest_key({})
