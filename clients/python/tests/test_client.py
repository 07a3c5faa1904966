"""The Python client against a real env-server over the wiki-18 sample corpus."""

import asyncio

import pytest
from websockets.asyncio.client import connect as ws_connect

from grove_client import AsyncClient, Client, GroveError, action, task

QUESTION = "who designed the Elmsworth Harbor Bridge?"
GOLD = ["Ada Kerrigan"]


def bridge_task(task_id=None):
    return task(QUESTION, GOLD, data_source="nq", task_id=task_id)


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------------------------------------
# sync API


def test_handshake_and_ping(server):
    with Client(server) as env:
        assert env.welcome["protocol_version"] == 1
        assert env.welcome["server"].startswith("grove-env-server/")
        assert env.limits["max_batch"] > 0
        assert env.ping(12345) == 12345


def test_search_then_answer_gives_reward(server):
    with Client(server) as env:
        [start] = env.create_episodes([bridge_task("t0")], max_turns=3)
        ep = start["episode"]
        assert QUESTION in start["prompt"] and start["max_turns"] == 3
        obs = env.step(ep, "<think>I need the designer.</think><search> Elmsworth Harbor Bridge </search>")
        assert (obs["episode"], obs["step"], obs["kind"], obs["done"]) == (ep, 1, "search", False)
        assert obs["turns_left"] == 2 and obs["reward"] is None
        assert obs["text"].startswith("\n\n<information>Doc 1(Title: ")
        assert "Ada Kerrigan" in obs["text"]
        obs = env.step(ep, "<think>Found it.</think><answer> Ada Kerrigan </answer>")
        assert (obs["kind"], obs["done"], obs["forced_final"]) == ("answer", True, False)
        reward = obs["reward"]
        assert reward["answer"] == "Ada Kerrigan"
        assert reward["metric"] == "em" and reward["metric_value"] == 1.0
        assert reward["format_valid"] is True and reward["score"] == 1.0


def test_structured_tool_calls(server):
    with Client(server) as env:
        [start] = env.create_episodes([bridge_task()])
        ep = start["episode"]
        obs = env.step_tool(ep, "search", query="Ada Kerrigan engineer")
        assert obs["kind"] == "search" and "<information>" in obs["text"]
        with pytest.raises(GroveError) as err:
            env.step_tool(ep, "browse", url="http://example.com")
        assert (err.value.code, err.value.number, err.value.episode) == ("invalid_action", 203, ep)
        obs = env.step(ep, {"name": "answer", "arguments": {"answer": "Lark Canal"}})
        assert obs["done"] and obs["reward"]["metric_value"] == 0.0
        assert obs["reward"]["answer"] == "Lark Canal"
        steps = env.transcript(ep)["steps"]
        assert [s["action"] for s in steps] == ["<search> Ada Kerrigan engineer </search>", "<answer> Lark Canal </answer>"]


def test_fork_children_are_independent(server):
    with Client(server) as env:
        [start] = env.create_episodes([bridge_task("fork")])
        parent = start["episode"]
        env.step(parent, "<search> Elmsworth Harbor Bridge </search>")
        forked = env.fork(parent, at_step=1, n=2)
        a, b = forked["children"]
        assert forked["parent"] == parent and forked["at_step"] == 1
        assert forked["lineage"] == {"root": parent, "parent": parent, "depth": 1, "fork_step": 1}
        right = env.step(a, "<answer> Ada Kerrigan </answer>")
        wrong = env.step(b, "<answer> Lark Canal </answer>")
        assert right["step"] == 2 and right["reward"]["metric_value"] == 1.0
        assert wrong["step"] == 2 and wrong["reward"]["metric_value"] == 0.0
        # The parent is untouched: still active, one step, and it can go on by itself.
        t = env.transcript(parent)
        assert t["status"] == "active" and len(t["steps"]) == 1 and t["reward"] is None
        assert t["lineage"] == {"root": parent, "parent": None, "depth": 0, "fork_step": None}
        assert env.step(parent, "no tags")["kind"] == "invalid"
        child = env.transcript(a)
        assert child["status"] == "done" and [s["kind"] for s in child["steps"]] == ["search", "answer"]
        # Closing the parent leaves the children alone; a fork at step 0 restarts from the prompt.
        assert env.close(parent) == [parent]
        assert env.transcript(b)["reward"]["answer"] == "Lark Canal"
        [again] = env.fork(a, at_step=0, n=1)["children"]
        assert env.transcript(again)["steps"] == []
        with pytest.raises(GroveError) as err:
            env.fork(a, at_step=5)
        assert err.value.code == "invalid_step" and err.value.number == 202


def test_close_and_episode_errors(server):
    with Client(server) as env:
        ep1, ep2 = (s["episode"] for s in env.create_episodes([bridge_task(), bridge_task()]))
        assert env.close(ep1) == [ep1]
        with pytest.raises(GroveError) as err:
            env.step(ep1, "<answer> x </answer>")
        assert (err.value.code, err.value.number, err.value.episode) == ("unknown_episode", 200, ep1)
        with pytest.raises(GroveError) as err:
            env.transcript(ep1)
        assert err.value.code == "unknown_episode"
        with pytest.raises(GroveError) as err:
            env.step(10**12, "<answer> x </answer>")
        assert err.value.code == "unknown_episode"
        # Bulk requests report per-item failures in order, without failing the others.
        results = env.close(ep2, ep1, raise_errors=False)
        assert results[0] == ep2
        assert isinstance(results[1], GroveError) and results[1].code == "unknown_episode"
        [ep3] = (s["episode"] for s in env.create_episodes([bridge_task()]))
        results = env.step_many([(ep3, "<search> a </search>"), (ep3, "<search> b </search>")], raise_errors=False)
        assert results[0]["kind"] == "search"
        assert isinstance(results[1], GroveError) and results[1].code == "duplicate_episode"
        env.step(ep3, "<answer> Ada Kerrigan </answer>")
        with pytest.raises(GroveError) as err:
            env.step(ep3, "<answer> again </answer>")
        assert err.value.code == "episode_done" and err.value.number == 201


def test_episodes_belong_to_their_connection(server):
    with Client(server) as owner, Client(server) as other:
        [start] = owner.create_episodes([bridge_task()])
        with pytest.raises(GroveError) as err:
            other.step(start["episode"], "<search> x </search>")
        assert (err.value.code, err.value.number) == ("not_owner", 205)


def test_a_closed_client_says_goodbye_and_its_episodes_close_at_once(server):
    """disconnect() closes with code 1000: the server ends the session now, not after its 60 s
    reattach grace (PROTOCOL.md section 10.1)."""
    import time

    with Client(server) as watcher:
        base = watcher.stats()["episodes_live"]
        env = Client(server)
        env.create_episodes([bridge_task(), bridge_task()])
        assert watcher.stats()["episodes_live"] == base + 2
        env.disconnect()
        deadline = time.monotonic() + 1.0
        while watcher.stats()["episodes_live"] != base and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watcher.stats()["episodes_live"] == base


def test_stats_count_work(server):
    with Client(server) as env:
        before = env.stats()
        [start] = env.create_episodes([bridge_task()])
        env.step(start["episode"], "<search> Ada Kerrigan </search>")
        env.fork(start["episode"], 1, 2)
        after = env.stats()
        assert after["episodes_created"] >= before["episodes_created"] + 3
        assert after["steps"] >= before["steps"] + 1
        assert after["searches"] >= before["searches"] + 1
        assert after["forks"] >= before["forks"] + 2
        assert after["uptime_ms"] >= before["uptime_ms"]


def test_action_helper_rejects_nonsense():
    assert action("text") == {"Text": "text"}
    assert action({"name": "search", "arguments": {"query": "q"}}) == {
        "Tool": {"name": "search", "arguments": {"query": "q"}}
    }
    with pytest.raises(TypeError):
        action(42)


# ---------------------------------------------------------------------------------------------
# async API


def test_async_many_requests_in_flight(server):
    async def main():
        async with await AsyncClient.connect(server, name="pytest") as env:
            starts = await env.create_episodes([bridge_task(f"a{i}") for i in range(8)])
            eps = [s["episode"] for s in starts]
            # Searches and pings in flight together: replies come back matched by id.
            searches = [env.step(ep, f"<search> Elmsworth bridge {i} </search>") for i, ep in enumerate(eps)]
            pings = [env.ping(n) for n in range(5)]
            results = await asyncio.gather(*searches, *pings)
            obs, pongs = results[: len(eps)], results[len(eps) :]
            assert [o["episode"] for o in obs] == eps
            assert all(o["kind"] == "search" and o["step"] == 1 for o in obs)
            assert pongs == list(range(5))
            answers = await env.step_many([(ep, "<answer> Ada Kerrigan </answer>") for ep in eps])
            assert all(o["done"] and o["reward"]["metric_value"] == 1.0 for o in answers)
            forked = await env.fork(eps[0], 1, 1)
            [child] = forked["children"]
            obs = await env.step_tool(child, "answer", answer="Ada Kerrigan")
            # Correct answer, but the child's text has no <think>: not the full score.
            assert obs["reward"]["metric_value"] == 1.0 and obs["reward"]["format_valid"] is False
            assert 0.0 < obs["reward"]["score"] < 1.0
            parent = await env.transcript(eps[0])
            assert parent["status"] == "done" and parent["task"]["task_id"] == "a0"
            assert await env.close(*eps) == eps
            with pytest.raises(GroveError) as err:
                await env.step(eps[0], "<answer> x </answer>")
            assert err.value.code == "unknown_episode"
            stats = await env.stats()
            assert stats["episodes_closed"] >= len(eps)

    run(main())


def test_async_handshake_is_required(server):
    async def main():
        ws = await ws_connect(server)
        env = AsyncClient(ws)  # no Hello
        try:
            with pytest.raises(GroveError) as err:
                await env.stats()
            assert (err.value.code, err.value.number) == ("handshake_required", 104)
            with pytest.raises(GroveError) as err:
                await env.hello(protocol_version=99)
            assert err.value.code == "unsupported_version"
            welcome = await env.hello()
            assert welcome["protocol_version"] == 1
            assert await env.ping(3) == 3
        finally:
            await env.disconnect()

    run(main())


# ---------------------------------------------------------------------------------------------
# connections that survive a blip


class CutProxy:
    """A loopback TCP proxy in front of the server; `cut()` closes every connection through it."""

    def __init__(self, upstream):
        self.host, self.port = upstream.removeprefix("ws://").rstrip("/").split(":")
        self.conns = []
        self.server = None

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/"

    async def _serve(self, cr, cw):
        sr, sw = await asyncio.open_connection(self.host, int(self.port))
        self.conns.append((cw, sw))

        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(cr, sw), pipe(sr, cw))

    def cut(self):
        for cw, sw in self.conns:
            cw.transport.abort()
            sw.transport.abort()
        self.conns.clear()

    def close(self):
        self.server.close()


def test_async_reattach_after_a_cut(server):
    async def main():
        proxy = CutProxy(server)
        url = await proxy.start()
        env = await AsyncClient.connect(url, reconnect_delay=0.05)
        try:
            assert env.welcome["session"]["grace_ms"] > 0
            starts = await env.create_episodes([bridge_task(f"r{i}") for i in range(8)])
            eps = [s["episode"] for s in starts]
            steps = [env.step(ep, "<search> Elmsworth Harbor Bridge </search>") for ep in eps]
            gathered = asyncio.gather(*steps)
            await asyncio.sleep(0)  # the requests are on their way
            proxy.cut()
            observations = await gathered
            assert [o["episode"] for o in observations] == eps
            assert all(o["step"] == 1 for o in observations)
            assert env.reconnects == 1
            # Nothing ran twice, and the session still owns its episodes.
            for ep in eps:
                assert len((await env.transcript(ep))["steps"]) == 1
            obs = await env.step(eps[0], "<answer> Ada Kerrigan </answer>")
            assert obs["done"] and obs["reward"]["metric_value"] == 1.0
        finally:
            await env.disconnect()
            proxy.close()

    run(main())
