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


def _options(options):
    """An `EpisodeOptions` map, fields in wire order (absent ones as nil)."""
    options = dict(options or {})
    wire = {key: options.pop(key, None) for key in ("max_turns", "topk", "backend", "prompt_template")}
    if options:
        raise TypeError(f"unknown episode options: {sorted(options)}")
    return wire


def _shape(shape):
    """A forest `shape` map from `{"m", "n", "l", "k"}` or a tuple `(m, n, l, k)`."""
    if isinstance(shape, dict):
        return {key: int(shape[key]) for key in ("m", "n", "l", "k")}
    m, n, l, k = shape
    return {"m": int(m), "n": int(n), "l": int(l), "k": int(k)}


def _step_action(item):
    """A `StepAction` map from `(episode, action)` or `(episode, action, data)`; `data` (bytes,
    sent as MessagePack bin) is left out when None."""
    if len(item) == 2:
        (ep, act), data = item, None
    else:
        ep, act, data = item
    wire = {"episode": ep, "action": action(act)}
    if data is not None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("step data is bytes")
        wire["data"] = bytes(data)
    return wire


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
    """A connected, handshaken client. Create with `await AsyncClient.connect(url)`.

    The connection survives a blip (protocol/PROTOCOL.md, "Sessions, heartbeats and reattach"):
    WebSocket pings every `heartbeat` seconds (the server's `heartbeat_ms` by default), a
    connection silent for as long again is dropped, and after a drop the client reconnects (at
    most `reconnect_tries` times, waiting `reconnect_delay` seconds doubled after each failure)
    and reattaches to its session, listing the requests it still waits for. Replies the server
    replays are delivered once; requests the server never received are sent again. When the
    session cannot be reattached, every waiting request raises ConnectionClosed with the
    reason."""

    def __init__(self, ws, timeout=None):
        self._ws = ws
        self._ids = itertools.count(1)  # id 0 is what the server uses for unmatched errors
        self._pending = {}  # id -> future
        self._frames = {}  # id -> (frame, handed to a connection)
        self._closed = None
        self._connected = asyncio.Event()
        self._connected.set()
        self._closing = False
        self.timeout = timeout
        self.welcome = None
        self.reconnects = 0
        self._url = None
        self._headers = None
        self._name = _DEFAULT_NAME
        self._heartbeat = None
        self.reconnect_tries = 8
        self.reconnect_delay = 0.1
        self._heartbeat_s = None
        self._closed_reason = None
        self._reader = None
        if ws is not None:
            # A client over a connection opened elsewhere: no handshake done, no reattach.
            self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(
        cls, url, token=None, name=None, timeout=None, heartbeat=None, reconnect_tries=8, reconnect_delay=0.1
    ):
        """Open `url` (ws://host:port/), send `Hello`, and return the client once `Welcome` came.

        `token` is sent as `Authorization: Bearer <token>`; `timeout` (seconds) bounds every
        request; `heartbeat` (seconds) overrides the server's heartbeat period."""
        headers = {"Authorization": f"Bearer {token}"} if token else None
        client = cls(None, timeout)
        client._url, client._headers, client._name = url, headers, name or _DEFAULT_NAME
        client._heartbeat = heartbeat
        client.reconnect_tries, client.reconnect_delay = reconnect_tries, reconnect_delay
        try:
            client._ws = await client._open()
            client.welcome = await client._handshake(client._ws, None)
            client._apply_heartbeat()
        except BaseException:
            if client._ws is not None:
                await client._ws.close()
            raise
        client._reader = asyncio.get_running_loop().create_task(client._read())
        return client

    async def _open(self):
        return await ws_connect(
            self._url,
            additional_headers=self._headers,
            max_size=None,
            compression=None,
            ping_interval=None,
        )

    def _apply_heartbeat(self):
        announced = (self.welcome or {}).get("limits", {}).get("heartbeat_ms", 0) / 1000.0
        self._heartbeat_s = self._heartbeat if self._heartbeat is not None else (announced or None)

    async def _handshake(self, ws, resume):
        """Send Hello (with `resume` when reattaching) and return the Welcome map."""
        rid = next(self._ids)
        hello = {"protocol_version": PROTOCOL_VERSION, "client": self._name}
        if resume is not None:
            hello["resume"] = resume
        await ws.send(encode({"id": rid, "msg": {"Hello": hello}}))
        while True:
            frame = await ws.recv()
            if isinstance(frame, str):
                continue
            env = decode(frame)
            if env["id"] != rid:
                self._deliver(env["id"], env["msg"])
                continue
            msg = env["msg"]
            if isinstance(msg, dict) and "Error" in msg:
                raise GroveError.from_info(msg["Error"])
            if not isinstance(msg, dict) or "Welcome" not in msg:
                raise UnexpectedReply(f"expected Welcome, got {msg!r}")
            return msg["Welcome"]

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.disconnect()

    @property
    def limits(self):
        return self.welcome["limits"] if self.welcome else None

    @property
    def closed(self):
        """True once the connection is gone for good (disconnected, or reattach failed)."""
        return self._closed is not None

    def _deliver(self, rid, msg):
        fut = self._pending.pop(rid, None)
        self._frames.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _fail_all(self, err):
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        self._frames.clear()

    async def _heartbeat_loop(self, ws):
        """Ping when silent; a connection that answers nothing for a whole period is closed
        here, which the reader sees as a drop."""
        period = self._heartbeat_s
        while True:
            await asyncio.sleep(period)
            try:
                pong = await ws.ping()
                await asyncio.wait_for(pong, period)
            except asyncio.TimeoutError:
                ws.transport.abort()
                return
            except Exception:
                return

    async def _serve(self, ws):
        """Read replies until the connection ends; returns why."""
        beat = None
        if self._heartbeat_s:
            beat = asyncio.get_running_loop().create_task(self._heartbeat_loop(ws))
        try:
            async for frame in ws:
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
                    self._fail_all(err)
                    return str(err), False
                self._deliver(rid, msg)
            return "the server closed the connection", True
        except WsConnectionClosed as e:
            return f"connection lost: {e}", True
        finally:
            if beat is not None:
                beat.cancel()

    async def _read(self):
        reason = "the server closed the connection"
        try:
            while True:
                reason, retry = await self._serve(self._ws)
                if self._closing or not retry:
                    break
                self._connected.clear()
                ws = await self._reattach(reason)
                if ws is None:
                    reason = self._closed_reason
                    break
                self._ws = ws
                self._connected.set()
        finally:
            self._closed = reason
            self._connected.set()
            self._fail_all(ConnectionClosed(reason))

    async def _reattach(self, why):
        """Reconnect and reattach; the new connection, or None (with `_closed_reason` set)."""
        session = (self.welcome or {}).get("session")
        if not session or not session.get("grace_ms") or self.reconnect_tries <= 0:
            self._closed_reason = f"{why}; the server offers no reattach"
            return None
        delay, last = self.reconnect_delay, ""
        for attempt in range(1, self.reconnect_tries + 1):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            try:
                ws = await self._open()
            except Exception as e:  # refused, reset, timed out
                last = f"attempt {attempt}: {e}"
                continue
            pending = sorted(rid for rid, (_, sent) in self._frames.items() if sent)
            try:
                welcome = await self._handshake(ws, {"token": session["token"], "pending": pending})
            except GroveError as e:
                await ws.close()
                if e.code == "session_expired":
                    self._closed_reason = f"{why}; the session could not be reattached: {e}"
                    return None
                last = f"attempt {attempt}: {e}"
                continue
            except Exception as e:
                last = f"attempt {attempt}: {e}"
                continue
            try:
                for rid in (welcome.get("resumed") or {}).get("resend", []):
                    if rid in self._frames:
                        await ws.send(self._frames[rid][0])
            except Exception as e:
                last = f"attempt {attempt}: resending failed: {e}"
                continue
            if not welcome.get("session"):
                welcome["session"] = session
            self.welcome = welcome
            self.reconnects += 1
            return ws
        self._closed_reason = f"{why}; {self.reconnect_tries} reconnect attempts failed, the last: {last}"
        return None

    async def request(self, msg):
        """Send one request (a wire `Request` value) and return the reply's `msg`.
        An `Error` reply is raised as GroveError."""
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        frame = encode({"id": rid, "msg": msg})
        self._pending[rid] = fut
        self._frames[rid] = (frame, False)
        try:
            await self._connected.wait()
            if self._closed is not None:
                raise ConnectionClosed(self._closed)
            if rid in self._frames:
                self._frames[rid] = (frame, True)
                try:
                    await self._ws.send(frame)
                except WsConnectionClosed:
                    pass  # still pending: the reattach sends it again if the server never got it
            reply = await asyncio.wait_for(fut, self.timeout)
        finally:
            self._pending.pop(rid, None)
            self._frames.pop(rid, None)
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
        """Send a `Hello` as a request (`connect` does the handshake; a second one is refused
        with `handshake_required`). Returns the `Welcome` map."""
        return await self._expect({"Hello": {"protocol_version": protocol_version, "client": name}}, "Welcome")

    async def create_episodes(
        self, tasks, max_turns=None, topk=None, backend=None, prompt_template=None, raise_errors=True
    ):
        """One episode per task (a dict or `task(...)`). Returns `EpisodeStart` maps
        (`episode`, `prompt`, `max_turns`); a failed task raises, or with `raise_errors=False`
        leaves a GroveError in its slot."""
        options = _options(
            {"max_turns": max_turns, "topk": topk, "backend": backend, "prompt_template": prompt_template}
        )
        msg = {"CreateEpisodes": {"tasks": [_task_spec(t) for t in tasks], "options": options}}
        created = await self._expect(msg, "EpisodesCreated")
        return _results(created["episodes"], raise_errors)

    async def step_many(self, actions, raise_errors=True):
        """Step several episodes at once: `actions` is a list of `(episode, action)` pairs or
        `(episode, action, data)` triples, `data` being bytes the server stores with the step
        (`data_too_large` above `limits["max_step_data_bytes"]`) or None. Returns one
        `Observation` map per item, in order."""
        wire = [_step_action(item) for item in actions]
        stepped = await self._expect({"Step": {"actions": wire}}, "Stepped")
        return _results(stepped["results"], raise_errors)

    async def step(self, episode, act, data=None):
        """Step one episode with model text (str) or a tool call dict, and optionally `data`
        (bytes kept with the step, returned in transcripts and forest prefixes); returns the
        Observation."""
        return (await self.step_many([(episode, act, data)]))[0]

    async def step_text(self, episode, text, data=None):
        return await self.step(episode, text, data)

    async def step_tool(self, episode, name, **arguments):
        """A structured tool call, e.g. `step_tool(ep, "search", query="...")`."""
        return await self.step(episode, {"name": name, "arguments": arguments})

    async def join_forest(self, key, shape, seed, task, options=None):
        """Join the forest `key` (every row of one prompt sends the same key, shape, seed, task
        and options) and return this row's `ForestRole` map: `row`, `tree`, `round`, `episode`
        (the episode to step), `prompt`, `max_turns`, `from` (`{episode, step}` of the node
        expanded, None for an initial chain) and `prefix` (the node's steps, each `{action,
        observation, data}`). `shape` is `{"m", "n", "l", "k"}` or `(m, n, l, k)`; `options`
        the episode options (`max_turns`, `topk`, `backend`, `prompt_template`). The reply of
        an expansion row waits until the chains it grows from have finished."""
        msg = {
            "JoinForest": {
                "key": key,
                "shape": _shape(shape),
                "seed": int(seed),
                "task": _task_spec(task),
                "options": _options(options),
            }
        }
        return await self._expect(msg, "ForestJoined")

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
        """Close the connection normally (WebSocket code 1000): a goodbye, so the server ends the
        session at once and closes every episode it owns (PROTOCOL.md section 10.1)."""
        self._closing = True
        await self._ws.close(code=1000)
        if self._reader is not None:
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
