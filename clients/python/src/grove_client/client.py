"""An asyncio client: one WebSocket connection, many requests in flight, replies matched to
their requests by id whatever order they arrive in (protocol/PROTOCOL.md, section 7)."""

import asyncio
import itertools

import msgpack
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed

from .errors import ConnectionClosed, GroveError, UnexpectedReply

PROTOCOL_VERSION = 1
_DEFAULT_NAME = "grove-client-python/0.1.0"


def encode(envelope):
    return msgpack.packb(envelope, use_bin_type=True)


def decode(frame):
    return msgpack.unpackb(frame, raw=False, strict_map_key=False)


def task(question, golden_answers, data_source="nq", task_id=None, metric=None):
    """A `TaskSpec` map, fields in wire order."""
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    return {
        "question": question,
        "golden_answers": list(golden_answers),
        "data_source": data_source,
        "task_id": task_id,
        "metric": metric,
    }


def _task_spec(t):
    if isinstance(t, dict):
        return task(
            t["question"],
            t["golden_answers"],
            t.get("data_source", "nq"),
            t.get("task_id"),
            t.get("metric"),
        )
    return task(*t)


def action(value):
    """The wire `Action` for model text (a str) or a tool call (`{"name": ..., "arguments": {...}}`)."""
    if isinstance(value, str):
        return {"Text": value}
    if isinstance(value, dict) and "name" in value:
        return {"Tool": {"name": value["name"], "arguments": dict(value.get("arguments", {}))}}
    if isinstance(value, dict) and len(value) == 1 and ("Text" in value or "Tool" in value):
        return value
    raise TypeError("an action is model text (str) or {'name': ..., 'arguments': {...}}")


def _results(items, raise_errors):
    """Unwrap `[{"Ok": x} | {"Err": info}]`: values, with GroveError in failed slots (or raised)."""
    out = []
    for item in items:
        if "Ok" in item:
            out.append(item["Ok"])
        else:
            err = GroveError.from_info(item["Err"])
            if raise_errors:
                raise err
            out.append(err)
    return out


class AsyncClient:
    """A connected, handshaken client. Create with `await AsyncClient.connect(url)`."""

    def __init__(self, ws, timeout=None):
        self._ws = ws
        self._ids = itertools.count(1)  # id 0 is what the server uses for unmatched errors
        self._pending = {}
        self._closed = None
        self.timeout = timeout
        self.welcome = None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, url, token=None, name=None, timeout=None):
        """Open `url` (ws://host:port/), send `Hello`, and return the client once `Welcome` came.

        `token` is sent as `Authorization: Bearer <token>`; `timeout` (seconds) bounds every
        request."""
        headers = {"Authorization": f"Bearer {token}"} if token else None
        ws = await ws_connect(url, additional_headers=headers, max_size=None, compression=None)
        client = cls(ws, timeout)
        try:
            client.welcome = await client.hello(name or _DEFAULT_NAME)
        except BaseException:
            await client.disconnect()
            raise
        return client

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.disconnect()

    @property
    def limits(self):
        return self.welcome["limits"] if self.welcome else None

    async def _read(self):
        reason = "the server closed the connection"
        try:
            async for frame in self._ws:
                if isinstance(frame, str):
                    continue
                try:
                    env = decode(frame)
                    rid, msg = env["id"], env["msg"]
                except Exception:  # a frame we cannot read answers nothing we can match
                    continue
                if rid == 0 and isinstance(msg, dict) and "Error" in msg:
                    # An error about the connection itself (limit, shutdown): every waiter gets it.
                    err = GroveError.from_info(msg["Error"])
                    reason = str(err)
                    for fut in self._pending.values():
                        if not fut.done():
                            fut.set_exception(err)
                    self._pending.clear()
                    continue
                fut = self._pending.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except WsConnectionClosed:
            pass
        finally:
            self._closed = reason
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionClosed(reason))
            self._pending.clear()

    async def request(self, msg):
        """Send one request (a wire `Request` value) and return the reply's `msg`.
        An `Error` reply is raised as GroveError."""
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._ws.send(encode({"id": rid, "msg": msg}))
        except WsConnectionClosed as e:
            self._pending.pop(rid, None)
            raise ConnectionClosed(str(e)) from e
        try:
            reply = await asyncio.wait_for(fut, self.timeout)
        finally:
            self._pending.pop(rid, None)
        if isinstance(reply, dict) and "Error" in reply:
            raise GroveError.from_info(reply["Error"])
        return reply

    async def _expect(self, msg, kind):
        reply = await self.request(msg)
        if kind == "Stats" and isinstance(reply, dict) and "Stats" in reply:
            return reply["Stats"]
        if not isinstance(reply, dict) or kind not in reply:
            raise UnexpectedReply(f"expected {kind}, got {reply!r}")
        return reply[kind]

    async def hello(self, name=_DEFAULT_NAME, protocol_version=PROTOCOL_VERSION):
        """The handshake; `connect` does it. Returns the `Welcome` map."""
        return await self._expect({"Hello": {"protocol_version": protocol_version, "client": name}}, "Welcome")

    async def create_episodes(
        self, tasks, max_turns=None, topk=None, backend=None, prompt_template=None, raise_errors=True
    ):
        """One episode per task (a dict or `task(...)`). Returns `EpisodeStart` maps
        (`episode`, `prompt`, `max_turns`); a failed task raises, or with `raise_errors=False`
        leaves a GroveError in its slot."""
        options = {"max_turns": max_turns, "topk": topk, "backend": backend, "prompt_template": prompt_template}
        msg = {"CreateEpisodes": {"tasks": [_task_spec(t) for t in tasks], "options": options}}
        created = await self._expect(msg, "EpisodesCreated")
        return _results(created["episodes"], raise_errors)

    async def step_many(self, actions, raise_errors=True):
        """Step several episodes at once: `actions` is a list of `(episode, action)` pairs.
        Returns one `Observation` map per pair, in order."""
        wire = [{"episode": ep, "action": action(a)} for ep, a in actions]
        stepped = await self._expect({"Step": {"actions": wire}}, "Stepped")
        return _results(stepped["results"], raise_errors)

    async def step(self, episode, act):
        """Step one episode with model text (str) or a tool call dict; returns the Observation."""
        return (await self.step_many([(episode, act)]))[0]

    async def step_text(self, episode, text):
        return await self.step(episode, text)

    async def step_tool(self, episode, name, **arguments):
        """A structured tool call, e.g. `step_tool(ep, "search", query="...")`."""
        return await self.step(episode, {"name": name, "arguments": arguments})

    async def fork_many(self, specs, raise_errors=True):
        """`specs` is a list of `(episode, at_step, n)`; returns `ForkResult` maps."""
        wire = [{"episode": ep, "at_step": at, "n": n} for ep, at, n in specs]
        forked = await self._expect({"Fork": {"forks": wire}}, "Forked")
        return _results(forked["results"], raise_errors)

    async def fork(self, episode, at_step, n=1):
        """Fork `episode` after `at_step` completed steps, `n` times; returns the ForkResult
        (`children` holds the new episode ids)."""
        return (await self.fork_many([(episode, at_step, n)]))[0]

    async def close(self, *episodes, raise_errors=True):
        """Close episodes (not the connection: see `disconnect`). Returns the closed ids."""
        closed = await self._expect({"Close": {"episodes": list(episodes)}}, "Closed")
        return _results(closed["results"], raise_errors)

    async def transcript(self, episode):
        return await self._expect({"GetTranscript": {"episode": episode}}, "Transcript")

    async def stats(self):
        return await self._expect("Stats", "Stats")

    async def ping(self, nonce=0):
        return (await self._expect({"Ping": {"nonce": nonce}}, "Pong"))["nonce"]

    async def disconnect(self):
        """Close the connection; the server closes every episode it owns."""
        await self._ws.close()
        try:
            await self._reader
        except asyncio.CancelledError:
            pass
