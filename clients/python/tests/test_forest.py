"""Step data and forests (JoinForest): the frames the client sends, checked offline against a
scripted stand-in server, and the real env-server's answers (docs/forest-wire.md)."""

import asyncio

import msgpack
import pytest

from grove_client import AsyncClient, Client, GroveError, decode, encode, task

QUESTION = "who designed the Elmsworth Harbor Bridge?"
GOLD = ["Ada Kerrigan"]


def bridge_task(task_id=None):
    return task(QUESTION, GOLD, data_source="nq", task_id=task_id)


# ---------------------------------------------------------------------------------------------
# offline: the frames


class ScriptedWs:
    """Enough of a websockets connection for AsyncClient: records each request it is sent and
    answers it with `reply(msg)`."""

    def __init__(self, reply):
        self.reply = reply
        self.sent = []
        self.frames = asyncio.Queue()

    async def send(self, frame):
        self.sent.append(frame)
        env = decode(frame)
        await self.frames.put(encode({"id": env["id"], "msg": self.reply(env["msg"])}))

    def __aiter__(self):
        return self

    async def __anext__(self):
        frame = await self.frames.get()
        if frame is None:
            raise StopAsyncIteration
        return frame

    async def close(self, code=1000):
        self.close_code = code
        await self.frames.put(None)


def test_step_data_travels_as_bin_and_is_left_out_when_absent():
    def reply(msg):
        actions = msg["Step"]["actions"]
        return {"Stepped": {"results": [{"Ok": {"episode": a["episode"], "step": 1}} for a in actions]}}

    async def main():
        ws = ScriptedWs(reply)
        env = AsyncClient(ws)
        try:
            await env.step(7, "<search> x </search>", data=b"\x00\x01")
            await env.step_many([(8, "a"), (9, "b", b"zz"), (10, "c", None)])
        finally:
            await env.disconnect()
        first = msgpack.unpackb(ws.sent[0], raw=True)  # raw: bin stays bytes, str becomes bytes too
        assert first[b"msg"][b"Step"][b"actions"] == [
            {b"episode": 7, b"action": {b"Text": b"<search> x </search>"}, b"data": b"\x00\x01"}
        ]
        # bin (0xc4) on the wire, not str
        assert b"\xc4\x02\x00\x01" in ws.sent[0]
        second = decode(ws.sent[1])["msg"]["Step"]["actions"]
        assert [("data" in a, a.get("data")) for a in second] == [(False, None), (True, b"zz"), (False, None)]

    asyncio.run(main())


def test_step_data_must_be_bytes():
    async def main():
        env = AsyncClient(ScriptedWs(lambda msg: msg))
        try:
            with pytest.raises(TypeError):
                await env.step(1, "x", data="not bytes")
        finally:
            await env.disconnect()

    asyncio.run(main())


def test_join_forest_frame_and_reply():
    role = {
        "key": "uid-1",
        "row": 3,
        "tree": 0,
        "round": 1,
        "episode": 12,
        "prompt": "Answer ...",
        "max_turns": 3,
        "from": {"episode": 4, "step": 1},
        "prefix": [{"action": "<search> a </search>", "observation": "\n\n<information>...", "data": b"\x81"}],
    }

    async def main():
        ws = ScriptedWs(lambda msg: {"ForestJoined": role})
        env = AsyncClient(ws)
        try:
            got = await env.join_forest("uid-1", (2, 2, 1, 3), 2**64 - 1, bridge_task("t"), {"max_turns": 3})
            with pytest.raises(TypeError):
                await env.join_forest("uid-1", (2, 2, 1, 3), 1, bridge_task(), {"max_turn": 3})
        finally:
            await env.disconnect()
        assert got == role
        msg = decode(ws.sent[0])["msg"]
        assert list(msg) == ["JoinForest"]
        join = msg["JoinForest"]
        assert list(join) == ["key", "shape", "seed", "task", "options"]
        assert join["shape"] == {"m": 2, "n": 2, "l": 1, "k": 3}
        assert join["seed"] == 2**64 - 1
        assert join["task"] == bridge_task("t")
        assert join["options"] == {"max_turns": 3, "topk": None, "backend": None, "prompt_template": None}

    asyncio.run(main())


def test_forest_errors_have_numbers():
    for code, number in [
        ("data_too_large", 306),
        ("invalid_forest", 307),
        ("forest_mismatch", 308),
        ("forest_full", 309),
        ("forest_expired", 310),
        ("too_many_forests", 311),
    ]:
        err = GroveError.from_info({"code": code, "message": "m"})
        assert (err.code, err.number) == (code, number)


# ---------------------------------------------------------------------------------------------
# the real env-server


def test_step_data_is_kept_and_shared_by_forks(server):
    with Client(server) as env:
        assert env.limits.get("max_step_data_bytes", 0) > 0
        [start] = env.create_episodes([bridge_task("data")])
        ep = start["episode"]
        blob = msgpack.packb({"ids": [1, 2, 3], "logprobs": [-0.5, -1.25, -0.125]}, use_bin_type=True)
        env.step(ep, "<search> Elmsworth Harbor Bridge </search>", data=blob)
        env.step(ep, "no tags at all")  # a step without data
        steps = env.transcript(ep)["steps"]
        assert steps[0]["data"] == blob
        assert steps[1].get("data") is None
        [child] = env.fork(ep, at_step=1)["children"]
        assert env.transcript(child)["steps"][0]["data"] == blob
        too_big = b"\x00" * (env.limits["max_step_data_bytes"] + 1)
        with pytest.raises(GroveError) as err:
            env.step(child, "<answer> Ada Kerrigan </answer>", data=too_big)
        assert (err.value.code, err.value.number, err.value.episode) == ("data_too_large", 306, child)
        # The refused step left the episode as it was.
        assert len(env.transcript(child)["steps"]) == 1


def test_join_forest_roles(server):
    """Shape (m=2, n=1, l=1, k=2): rows 0 and 1 play the initial chains, rows 2 and 3 expand
    trees 0 and 1 once those chains have finished."""

    async def main():
        key = "pytest-forest-roles"
        shape = {"m": 2, "n": 1, "l": 1, "k": 2}
        async with await AsyncClient.connect(server) as a, await AsyncClient.connect(server) as b:
            r0 = await a.join_forest(key, shape, 7, bridge_task("f"), {"max_turns": 2})
            r1 = await b.join_forest(key, shape, 7, bridge_task("f"), {"max_turns": 2})
            assert (r0["row"], r0["tree"], r0["round"], r0.get("from"), r0["prefix"]) == (0, 0, 0, None, [])
            assert (r1["row"], r1["tree"], r1["round"]) == (1, 1, 0)
            assert r0["max_turns"] == 2 and QUESTION in r0["prompt"]
            # The expansion of tree 0 waits for the chain of row 0.
            r2 = asyncio.ensure_future(b.join_forest(key, shape, 7, bridge_task("f"), {"max_turns": 2}))
            await asyncio.sleep(0.3)
            assert not r2.done()
            blob = msgpack.packb({"ids": [5, 6], "logprobs": [-0.1, -0.2]}, use_bin_type=True)
            await a.step(r0["episode"], "<think>x</think><search> Elmsworth Harbor Bridge </search>", data=blob)
            await a.step(r0["episode"], "<think>y</think><answer> Ada Kerrigan </answer>", data=blob)
            r2 = await asyncio.wait_for(r2, 30)
            assert (r2["row"], r2["tree"], r2["round"]) == (2, 0, 1)
            assert r2["from"]["episode"] == r0["episode"] and r2["from"]["step"] in (0, 1)
            assert len(r2["prefix"]) == r2["from"]["step"]
            for step in r2["prefix"]:
                assert step["data"] == blob and step["action"].endswith("</search>")
            t = await b.transcript(r2["episode"])
            assert t["lineage"]["parent"] == r0["episode"] and t["lineage"]["fork_step"] == r2["from"]["step"]
            # Other gold answers, or another seed, under the same key are refused (and take no
            # row); so is a join beyond m*k.
            with pytest.raises(GroveError) as err:
                await b.join_forest(key, shape, 7, task(QUESTION, ["Lark Canal"]), {"max_turns": 2})
            assert err.value.code == "forest_mismatch" and err.value.number == 308
            with pytest.raises(GroveError) as err:
                await b.join_forest(key, shape, 8, bridge_task("f"), {"max_turns": 2})
            assert err.value.code == "forest_mismatch"
            r3 = asyncio.ensure_future(a.join_forest(key, shape, 7, bridge_task("f"), {"max_turns": 2}))
            await b.step(r1["episode"], "<answer> Lark Canal </answer>")
            r3 = await asyncio.wait_for(r3, 30)
            assert (r3["row"], r3["tree"], r3["round"]) == (3, 1, 1)
            with pytest.raises(GroveError) as err:
                await a.join_forest(key, shape, 7, bridge_task("f"), {"max_turns": 2})
            assert err.value.code == "forest_full" and err.value.number == 309
            for row, env in ((r2, b), (r3, a)):
                obs = await env.step(row["episode"], "<answer> Ada Kerrigan </answer>")
                assert obs["done"]

    asyncio.run(main())


def test_join_forest_refuses_bad_shapes(server):
    with Client(server) as env:
        for shape in [(2, 2, 1, 2), (0, 0, 0, 1)]:
            with pytest.raises(GroveError) as err:
                env.join_forest("pytest-bad-shape", shape, 1, bridge_task())
            assert err.value.code == "invalid_forest" and err.value.number == 307
        with pytest.raises(GroveError) as err:
            env.join_forest("", (1, 0, 0, 1), 1, bridge_task())
        assert err.value.code == "invalid_forest"
