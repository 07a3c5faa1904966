"""The `tree_grpo` estimator: the spec's worked example, the shared fixture (which the Rust
trainer's advantage code is checked against too), and the path through verl's own
`compute_advantage` that `grove_verl.install()` wraps."""

import json
import pathlib
import sys

import numpy as np
import pytest
import torch

import grove_verl
from grove_verl.advantage import compute_tree_grpo_advantage, group_normalised, tree_grpo_scores, tree_ids

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
CASES = json.loads((FIXTURES / "tree_advantage.json").read_text())


def test_spec_worked_example():
    # Spec 2.7 / 3.3: R = 1, 0, 0.2 | 1, 1, 0. The spec's A column is the sum of its rounded inter
    # and intra columns, so it can differ from the exact sum in the third decimal by 0.0005.
    rewards, uids, trees = [1.0, 0.0, 0.2, 1.0, 1.0, 0.0], ["u"] * 6, ["t1"] * 3 + ["t2"] * 3
    a = tree_grpo_scores(rewards, uids, trees)
    assert np.allclose(a, [2.038, -1.789, -1.024, 1.481, 1.481, -2.188], atol=6e-4, rtol=0)
    inter = [0.904, -1.033, -0.646, 0.904, 0.904, -1.033]
    intra = [1.134, -0.756, -0.378, 0.577, 0.577, -1.155]
    assert np.allclose(group_normalised(rewards, uids), inter, atol=6e-4, rtol=0)
    assert np.allclose(group_normalised(rewards, trees), intra, atol=6e-4, rtol=0)


def test_fixture_is_what_its_generator_writes():
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_tree_advantage
    finally:
        sys.path.pop(0)
    assert make_tree_advantage.cases() == CASES


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_fixture_cases(case):
    got = tree_grpo_scores(case["rewards"], case["uids"], case["tree_ids"])
    assert np.allclose(got, case["expected"], atol=1e-12, rtol=0)


def batch(rewards, uids, trees, lengths=None, width=7):
    """A verl DataProto as the trainer holds it before compute_advantage: the score on the last
    response token, the response mask, uid and tree_uid columns."""
    from verl.protocol import DataProto

    n = len(rewards)
    lengths = lengths or [1 + (3 * i) % width for i in range(n)]
    mask = torch.zeros(n, width, dtype=torch.int64)
    scores = torch.zeros(n, width, dtype=torch.float32)
    for i, (r, length) in enumerate(zip(rewards, lengths)):
        mask[i, :length] = 1
        scores[i, length - 1] = r
    return DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object), "tree_uid": np.array(trees, dtype=object)},
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_through_verls_compute_advantage(case):
    grove_verl.install()
    from verl.trainer.ppo import ray_trainer

    data = batch(case["rewards"], case["uids"], case["tree_ids"])
    out = ray_trainer.compute_advantage(data, adv_estimator="tree_grpo", config={})
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    expected = torch.tensor(case["expected"], dtype=torch.float32).unsqueeze(-1) * mask
    assert torch.allclose(adv, expected, atol=1e-5, rtol=0)
    assert torch.equal(out.batch["returns"], adv)
    assert torch.all(adv[mask == 0] == 0)


def test_registered_with_verl():
    from verl.trainer.ppo import core_algos

    assert core_algos.get_adv_estimator_fn("tree_grpo") is compute_tree_grpo_advantage


def test_one_tree_is_twice_verls_grpo():
    from verl.trainer.ppo import core_algos

    data = batch([1.0, 0.0, 0.2, 0.7], ["m"] * 4, ["m/0"] * 4)
    kwargs = dict(token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"])
    grpo, _ = core_algos.compute_grpo_outcome_advantage(index=data.non_tensor_batch["uid"], **kwargs)
    with tree_ids(data.non_tensor_batch["tree_uid"]):
        ours, _ = compute_tree_grpo_advantage(index=data.non_tensor_batch["uid"], **kwargs)
    assert torch.allclose(ours, 2 * grpo, atol=1e-5)


def test_other_estimators_pass_through_the_wrapper():
    grove_verl.install()
    from verl.trainer.ppo import ray_trainer

    data = batch([1.0, 0.0, 0.2], ["g"] * 3, ["x", "y", "z"])
    out = ray_trainer.compute_advantage(data, adv_estimator="grpo")
    assert out.batch["advantages"][0].max() > 0 and out.batch["advantages"][1].min() < 0


def test_without_tree_ids_it_says_how_to_get_them():
    data = batch([1.0, 0.0], ["u", "u"], ["a", "b"])
    with pytest.raises(RuntimeError, match="worker_process_setup_hook=grove_verl.install"):
        compute_tree_grpo_advantage(
            data.batch["token_level_rewards"], data.batch["response_mask"], index=data.non_tensor_batch["uid"]
        )
    grove_verl.install()
    from verl.trainer.ppo import ray_trainer

    data.non_tensor_batch.pop("tree_uid")
    with pytest.raises(KeyError, match="tree_uid"):
        ray_trainer.compute_advantage(data, adv_estimator="tree_grpo")


def test_install_is_idempotent():
    grove_verl.install()
    from verl.trainer.ppo import ray_trainer

    first = ray_trainer.compute_advantage
    grove_verl.install()
    assert ray_trainer.compute_advantage is first
