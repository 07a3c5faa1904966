"""The agent loop's own settings: the `grove:` map of its entry in verl's
`actor_rollout_ref.rollout.agent.agent_loop_config_path` YAML.

verl builds every agent loop with `hydra.utils.instantiate(entry, ...)`, so each key of the entry
other than `name` and `_target_` reaches the constructor as a keyword argument; Grove's settings
travel as one of them, `grove`, and any key in it that is not a field below is an error."""

import dataclasses
import os
from collections.abc import Mapping
from typing import Optional

MODES = ("tree", "chain")


@dataclasses.dataclass(frozen=True)
class GroveLoopConfig:
    """Settings of `GroveTreeAgentLoop` (see README.md, "Configuration")."""

    url: str
    """The env-server's WebSocket URL, `ws://host:port/`."""
    token_env: Optional[str] = None
    """Name of an environment variable holding the env-server's bearer token (never the token)."""
    mode: str = "tree"
    """`tree`: Tree-GRPO forests of shape (m, n, l, k), rollout.n = m * k. `chain`: every row is
    its own chain, the shape (rollout.n, 0, 0, 1)."""
    m: int = 2
    n: int = 2
    l: int = 1  # noqa: E741 (the spec's name)
    k: int = 3
    seed: int = 0
    """Seeds the env-server's node picks; each forest's seed is derived from it and the key."""
    max_turns: int = 3
    """Tool turns per episode (the env-server's `max_turns` option); one more forced final turn."""
    topk: int = 3
    """Documents per search."""
    backend: Optional[str] = None
    """The env-server backend (None: its first)."""
    max_obs_tokens: int = 500
    """Observation tokens kept per step (the rest are cut, as Search-R1 does)."""
    max_tokens_per_turn: int = 500
    """Generated tokens per turn (further capped by what is left of rollout.response_length)."""
    stop: tuple = ("</search>", "</answer>")
    """Stop strings of every generation."""
    extra_sampling_params: Mapping = dataclasses.field(default_factory=dict)
    """Added to every generate call's sampling_params (after Grove's own, so they win)."""
    keep_stop_strings: bool = True
    """Ask the inference server to keep the stop string in its output: vLLM
    `include_stop_str_in_output`, SGLang `no_stop_trim` (by rollout.name; others: nothing)."""
    connect_timeout_s: float = 60.0

    @classmethod
    def from_mapping(cls, settings, rollout_n=None):
        """Build from the YAML map (a dict or an OmegaConf DictConfig). Unknown keys, a bad mode
        or a shape that does not fit rollout.n raise ValueError."""
        if settings is None:
            raise ValueError(
                "GroveTreeAgentLoop needs its settings: add `grove: {url: ws://host:port/, ...}` to its entry in "
                "actor_rollout_ref.rollout.agent.agent_loop_config_path (see clients/verl/README.md)"
            )
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(settings, DictConfig):
                settings = OmegaConf.to_container(settings, resolve=True)
        except ImportError:  # pragma: no cover
            pass
        if not isinstance(settings, Mapping):
            raise ValueError(f"grove settings must be a map, got {type(settings).__name__}")
        settings = dict(settings)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown grove settings {unknown}; known: {sorted(known)}")
        if "url" not in settings:
            raise ValueError("grove settings need `url` (the env-server's ws://host:port/)")
        if "stop" in settings:
            settings["stop"] = tuple(settings["stop"])
        if "extra_sampling_params" in settings:
            settings["extra_sampling_params"] = dict(settings["extra_sampling_params"] or {})
        config = cls(**settings)
        config.validate(rollout_n)
        return config

    def validate(self, rollout_n=None):
        if self.mode not in MODES:
            raise ValueError(f"grove mode must be one of {MODES}, got {self.mode!r}")
        for name in ("m", "n", "l", "k", "max_turns", "topk", "max_obs_tokens", "max_tokens_per_turn", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"grove {name} must be a non-negative integer, got {value!r}")
        if not str(self.url).startswith(("ws://", "wss://")):
            raise ValueError(f"grove url must be ws:// or wss://, got {self.url!r}")
        if self.mode == "tree":
            if self.m < 1:
                raise ValueError("grove m must be at least 1")
            if self.k != 1 + self.n * self.l:
                raise ValueError(f"grove k must be 1 + n*l = {1 + self.n * self.l} (every chain is a row), got {self.k}")
            if rollout_n is not None and rollout_n != self.m * self.k:
                raise ValueError(
                    f"actor_rollout_ref.rollout.n is {rollout_n}, but a tree of shape "
                    f"(m={self.m}, n={self.n}, l={self.l}, k={self.k}) has m*k = {self.m * self.k} rows"
                )
        if self.token_env is not None and not self.token_env:
            raise ValueError("grove token_env is the name of an environment variable")

    def shape(self, rollout_n):
        """(m, n, l, k) of a forest."""
        if self.mode == "chain":
            return (rollout_n, 0, 0, 1)
        return (self.m, self.n, self.l, self.k)

    def token(self):
        if self.token_env is None:
            return None
        value = os.environ.get(self.token_env)
        if not value:
            raise ValueError(f"grove token_env names {self.token_env}, which is not set")
        return value
