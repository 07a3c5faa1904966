"""What the forest tests observe and check: the env-server's own record of each row's episode
(its transcript, fetched right after JoinForest, while the forest still holds it) and the
observation that ended it, against the rows' outputs."""

import struct


class Recorder:
    """Wraps an AsyncClient's join_forest and step: keeps each row's transcript at join time
    (lineage, inherited steps) and the reward of the step that ended its episode."""

    def __init__(self, client):
        self.client = client
        self.joined = {}  # episode -> transcript right after the join
        self.rewards = {}  # episode -> Reward of its last step
        join, step = client.join_forest, client.step

        async def join_forest(*args, **kwargs):
            role = await join(*args, **kwargs)
            self.joined[role["episode"]] = await client.transcript(role["episode"])
            return role

        async def stepped(episode, act, data=None):
            obs = await step(episode, act, data)
            if obs["done"]:
                self.rewards[episode] = obs["reward"]
            return obs

        client.join_forest, client.step = join_forest, stepped

    def plain(self):
        """JSON-friendly copy (step data as hex), for a worker process to hand back."""
        joined = {}
        for ep, t in self.joined.items():
            steps = [{**s, "data": s["data"].hex() if s.get("data") is not None else None} for s in t["steps"]]
            joined[str(ep)] = {"lineage": t["lineage"], "steps": steps}
        return {"joined": joined, "rewards": {str(ep): r for ep, r in self.rewards.items()}}


def row_record(out):
    """The parts of an AgentLoopOutput the checks need, JSON-friendly."""
    return {
        "prompt_ids": list(out.prompt_ids),
        "response_ids": list(out.response_ids),
        "response_mask": list(out.response_mask),
        "response_logprobs": list(out.response_logprobs) if out.response_logprobs is not None else None,
        "reward_score": out.reward_score,
        "extra": {k: v for k, v in out.extra_fields.items()},
    }


def _bits(floats):
    return [struct.pack("<d", x) for x in floats]


def check_forest(rows, joined, rewards, shape):
    """The rows of one forest form its trees as the env-server recorded them. `rows` are
    row_record()s, `joined` transcripts at join by episode, `rewards` by episode."""
    m, n, l, k = shape
    assert len(rows) == m * k
    extras = [r["extra"] for r in rows]
    assert sorted(e["grove_row"] for e in extras) == list(range(m * k))
    assert len({e["grove_key"] for e in extras}) == 1
    key = extras[0]["grove_key"]
    by_episode = {e["grove_episode"]: r for r, e in zip(rows, extras)}
    assert len(by_episode) == m * k
    for t in range(m):
        tree = [e for e in extras if e["grove_tree"] == t]
        assert len(tree) == k
        assert sorted(e["grove_round"] for e in tree) == [0] + sorted(r for r in range(1, l + 1) for _ in range(n))
        assert {e["tree_uid"] for e in tree} == {f"{key}/{t}"}
    for r in rows:
        e = r["extra"]
        ep = e["grove_episode"]
        ids, mask, lps = r["response_ids"], r["response_mask"], r["response_logprobs"]
        assert len(ids) == len(mask) == len(lps) and set(mask) <= {0, 1} and 1 in mask
        assert all(lp == 0.0 for lp, bit in zip(lps, mask) if bit == 0)
        assert e["grove_step_ends"][-1] == len(ids) and not e["grove_truncated"]
        # The reward is the env-server's.
        assert r["reward_score"] == rewards[ep]["score"]
        lineage = joined[ep]["lineage"]
        if e["grove_round"] == 0:
            assert lineage["parent"] is None and lineage["root"] == ep and joined[ep]["steps"] == []
            assert e["grove_from_episode"] == -1 and e["grove_prefix_tokens"] == 0
            continue
        parent = by_episode[e["grove_from_episode"]]
        pe = parent["extra"]
        s = e["grove_from_step"]
        assert pe["grove_tree"] == e["grove_tree"] and pe["grove_round"] < e["grove_round"]
        # The server's record: forked from that episode after that step.
        assert (lineage["parent"], lineage["fork_step"]) == (pe["grove_episode"], s)
        # A node is the root or a non-leaf step of the parent's chain.
        assert 0 <= s < len(pe["grove_step_ends"])
        assert len(joined[ep]["steps"]) == s
        # The continuation's prefix is the parent's tokens up to the node, byte for byte.
        p = 0 if s == 0 else pe["grove_step_ends"][s - 1]
        assert e["grove_prefix_tokens"] == p and e["grove_step_ends"][: max(s, 0)] == pe["grove_step_ends"][:s]
        assert ids[:p] == parent["response_ids"][:p]
        assert mask[:p] == parent["response_mask"][:p]
        assert _bits(lps[:p]) == _bits(parent["response_logprobs"][:p])
        assert r["prompt_ids"] == parent["prompt_ids"]
