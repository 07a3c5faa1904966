"""Grove for verl: the `grove_tree` agent loop (Tree-GRPO rollouts through a Grove env-server)
and the `tree_grpo` advantage estimator. Written against verl 0.9.1."""

__version__ = "0.1.0"


def install():
    """Register the agent loop `grove_tree` and the estimator `tree_grpo`, and wrap verl's
    `compute_advantage` so that the estimator sees the batch's tree ids. Use it as the Ray
    worker setup hook, so that it runs in verl's trainer process and agent-loop workers:

        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=grove_verl.install
    """
    from . import advantage, agent_loop  # noqa: F401  (registers grove_tree)

    advantage.install()


def __getattr__(name):
    # Lazy, so that `import grove_verl` (for install, or the config) does not import verl.
    if name in ("GroveTreeAgentLoop", "connection", "close_connections", "pack_step_data", "unpack_step_data"):
        from . import agent_loop

        return getattr(agent_loop, name)
    if name in ("compute_tree_grpo_advantage", "tree_grpo_scores", "group_normalised", "tree_ids"):
        from . import advantage

        return getattr(advantage, name)
    if name == "GroveLoopConfig":
        from .config import GroveLoopConfig

        return GroveLoopConfig
    raise AttributeError(name)


__all__ = [
    "GroveLoopConfig",
    "GroveTreeAgentLoop",
    "close_connections",
    "compute_tree_grpo_advantage",
    "connection",
    "group_normalised",
    "install",
    "pack_step_data",
    "tree_grpo_scores",
    "tree_ids",
    "unpack_step_data",
]
