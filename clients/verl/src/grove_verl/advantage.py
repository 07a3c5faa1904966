"""The Tree-GRPO advantage (Grove's shared spec, section 3.3) as the verl estimator `tree_grpo`.

    A_i = norm_uid(i)(R_i) + norm_tree(i)(R_i),   norm_S(R_i) = (R_i - mean_S) / (std_S + 1e-6)

with the unbiased std; a group of one has mean 0 and std 1 (R_i / (1 + 1e-6)); a group whose
rewards are all equal gives 0. R_i is the row's summed token-level reward; A_i is tiled over the
row's response_mask.

verl hands an estimator `index` (the prompt's uid) only. The tree ids, the `tree_uid` column the
agent loop writes, reach it through `tree_ids(...)`, a context that `install()` wraps around
verl's `compute_advantage`. Supported: verl 0.9.1 (tested) with the legacy trainer
(`trainer.use_v1=false`, `ray_trainer.RayPPOTrainer`); see README.md for older versions and V1."""

import contextlib
import contextvars
import functools
from collections import defaultdict

import numpy as np
import torch

EPSILON = 1e-6
TREE_COLUMN = "tree_uid"
NAME = "tree_grpo"

_TREE_IDS = contextvars.ContextVar("grove_verl_tree_ids", default=None)


def group_normalised(scores, groups, epsilon=EPSILON):
    """`norm_S(R_i)` for every row, S being the rows with the same group id (float64 numpy)."""
    scores = np.asarray(scores, dtype=np.float64)
    out = np.zeros_like(scores)
    members = defaultdict(list)
    for i, group in enumerate(groups):
        members[group].append(i)
    for rows in members.values():
        values = scores[rows]
        if len(rows) == 1:
            out[rows] = values / (1.0 + epsilon)
        elif np.all(values == values[0]):
            out[rows] = 0.0
        else:
            out[rows] = (values - values.mean()) / (values.std(ddof=1) + epsilon)
    return out


def tree_grpo_scores(scores, uids, tree_ids, epsilon=EPSILON):
    """One advantage per row: GRPO over `uids` plus GRPO over `tree_ids` (float64 numpy)."""
    if not (len(scores) == len(uids) == len(tree_ids)):
        raise ValueError(f"{len(scores)} scores, {len(uids)} uids and {len(tree_ids)} tree ids")
    return group_normalised(scores, uids, epsilon) + group_normalised(scores, tree_ids, epsilon)


@contextlib.contextmanager
def tree_ids(ids):
    """Within the block, `tree_grpo` groups rows by `ids` (one per row, in batch order)."""
    token = _TREE_IDS.set(np.asarray(ids, dtype=object))
    try:
        yield
    finally:
        _TREE_IDS.reset(token)


def compute_tree_grpo_advantage(
    token_level_rewards, response_mask, index=None, config=None, tree_index=None, epsilon=EPSILON, **kwargs
):
    """verl's estimator signature: returns (advantages, returns), both the advantage tiled over
    `response_mask`. `tree_index` defaults to the ids of the enclosing `tree_ids(...)`."""
    if index is None:
        raise ValueError("tree_grpo needs the uid of every row (verl passes it as `index`)")
    if tree_index is None:
        tree_index = _TREE_IDS.get()
    if tree_index is None:
        raise RuntimeError(
            "tree_grpo got no tree ids: call grove_verl.install() in the process that computes advantages "
            "(the Ray setup hook `+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=grove_verl.install`) "
            "and use the legacy trainer (trainer.use_v1=false), whose compute_advantage it wraps"
        )
    scores = token_level_rewards.detach().sum(dim=-1).double().cpu().numpy()
    advantage = tree_grpo_scores(scores, list(index), list(tree_index), epsilon)
    with torch.no_grad():
        per_row = torch.as_tensor(advantage, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        advantages = per_row.unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)
    return advantages, advantages


def _wrap_compute_advantage(compute_advantage):
    """verl's `compute_advantage(data, adv_estimator, ...)`, run inside `tree_ids(data's
    tree_uid column)` when the estimator is tree_grpo."""
    if getattr(compute_advantage, "_grove_wrapped", False):
        return compute_advantage

    @functools.wraps(compute_advantage)
    def wrapper(data, adv_estimator, *args, **kwargs):
        name = getattr(adv_estimator, "value", adv_estimator)
        if name != NAME:
            return compute_advantage(data, adv_estimator, *args, **kwargs)
        if TREE_COLUMN not in data.non_tensor_batch:
            raise KeyError(
                f"tree_grpo: the batch has no `{TREE_COLUMN}` column (non_tensor_batch keys: "
                f"{sorted(data.non_tensor_batch)}); the rollout must come from GroveTreeAgentLoop"
            )
        with tree_ids(data.non_tensor_batch[TREE_COLUMN]):
            return compute_advantage(data, adv_estimator, *args, **kwargs)

    wrapper._grove_wrapped = True
    return wrapper


def register():
    """Register `tree_grpo` with verl's estimator registry (idempotent)."""
    from verl.trainer.ppo import core_algos

    if core_algos.ADV_ESTIMATOR_REGISTRY.get(NAME) is not compute_tree_grpo_advantage:
        core_algos.register_adv_est(NAME)(compute_tree_grpo_advantage)


def install():
    """Register the estimator and wrap verl's `ray_trainer.compute_advantage` (the function
    `RayPPOTrainer.fit` calls) so that tree_grpo sees the batch's tree ids. Idempotent."""
    register()
    from verl.trainer.ppo import ray_trainer

    ray_trainer.compute_advantage = _wrap_compute_advantage(ray_trainer.compute_advantage)


register()
