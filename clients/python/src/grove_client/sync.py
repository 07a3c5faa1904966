"""A blocking client for plain scripts: an AsyncClient driven by an event loop on a private
background thread. Every method blocks until its reply arrives; it is safe to call from any
thread (including code that already runs its own asyncio loop elsewhere)."""

import asyncio
import threading

from .client import AsyncClient


class Client:
    """Blocking twin of AsyncClient, with the same methods. `close(*episodes)` closes episodes;
    `disconnect()` (or leaving a `with` block) closes the connection and stops the thread."""

    def __init__(self, url, token=None, name=None, timeout=None):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grove-client", daemon=True)
        self._thread.start()
        try:
            self._client = self._run(AsyncClient.connect(url, token=token, name=name, timeout=timeout))
        except BaseException:
            self._stop()
            raise

    @classmethod
    def connect(cls, url, token=None, name=None, timeout=None):
        return cls(url, token=token, name=name, timeout=timeout)

    def _run(self, coro):
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the client is disconnected")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self):
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.disconnect()

    @property
    def welcome(self):
        return self._client.welcome

    @property
    def limits(self):
        return self._client.limits

    def request(self, msg):
        return self._run(self._client.request(msg))

    def create_episodes(self, tasks, **options):
        return self._run(self._client.create_episodes(tasks, **options))

    def step_many(self, actions, raise_errors=True):
        return self._run(self._client.step_many(actions, raise_errors=raise_errors))

    def step(self, episode, act, data=None):
        return self._run(self._client.step(episode, act, data))

    def step_text(self, episode, text, data=None):
        return self._run(self._client.step_text(episode, text, data))

    def step_tool(self, episode, name, **arguments):
        return self._run(self._client.step_tool(episode, name, **arguments))

    def join_forest(self, key, shape, seed, task, options=None):
        return self._run(self._client.join_forest(key, shape, seed, task, options))

    def fork_many(self, specs, raise_errors=True):
        return self._run(self._client.fork_many(specs, raise_errors=raise_errors))

    def fork(self, episode, at_step, n=1):
        return self._run(self._client.fork(episode, at_step, n))

    def close(self, *episodes, raise_errors=True):
        return self._run(self._client.close(*episodes, raise_errors=raise_errors))

    def transcript(self, episode):
        return self._run(self._client.transcript(episode))

    def stats(self):
        return self._run(self._client.stats())

    def ping(self, nonce=0):
        return self._run(self._client.ping(nonce))

    def disconnect(self):
        if not self._thread.is_alive():
            return
        try:
            self._run(self._client.disconnect())
        finally:
            self._stop()
