"""The legacy trainer's data path without Ray: verl's own AgentLoopWorker runs the 6 rows of one
prompt through `grove_tree` (named by agent_loop_config_path / default_agent_loop, as in
training), pads them into a DataProto; the reward and tree columns then go through verl's
`extract_reward` and the wrapped `compute_advantage` with adv_estimator=tree_grpo, as
`RayPPOTrainer.fit` does. SmolLM2 on the CPU stands in for the inference server."""

import asyncio

import numpy as np
import torch

import grove_verl
from grove_verl.advantage import tree_grpo_scores
from grove_verl.agent_loop import close_connections
from verl_setup import gen_batch, trainer_config, write_loops_yaml

SMALL = dict(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=64)


def test_agent_loop_worker_to_tree_grpo_advantages(server, smollm2_dir, tmp_path):
    from hf_server import TransformersServer
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.reward import extract_reward

    grove_verl.install()
    loops = write_loops_yaml(tmp_path / "loops.yaml", server, mode="tree", m=2, n=2, l=1, k=3, **SMALL)
    config = trainer_config(smollm2_dir, 6, loops, response_length=512)
    gen = TransformersServer(smollm2_dir, seed=99)

    async def main():
        worker = AgentLoopWorker(config, llm_client=gen)
        try:
            # RayPPOTrainer.fit: the generation batch takes every column but the reward ones
            # (_get_gen_batch), is repeated rollout.n times and goes to the agent loops.
            batch = gen_batch(config, worker.tokenizer, question_id="train_2", repeat=False)
            reward_keys = {"data_source", "reward_model", "extra_info", "uid"}
            generation = batch.pop(batch_keys=[], non_tensor_batch_keys=list(set(batch.non_tensor_batch) - reward_keys))
            generation.non_tensor_batch.update(batch.non_tensor_batch)
            generation = generation.repeat(repeat_times=6, interleave=True)
            return batch, await worker.generate_sequences(generation)
        finally:
            await close_connections()

    batch, output = asyncio.run(main())
    # fit: the prompt batch repeated, joined with the rollout.
    output = batch.repeat(repeat_times=6, interleave=True).union(output)
    assert len(output) == 6
    nt = output.non_tensor_batch
    assert len(set(nt["uid"])) == 1 and len(set(nt["tree_uid"])) == 2
    assert sorted(nt["grove_row"]) == list(range(6))
    # rm_scores: each row's env-server score on its last response token.
    rm = output.batch["rm_scores"]
    scores = np.array([r["score"] for r in nt["grove_reward"]], dtype=np.float32)
    assert torch.allclose(rm.sum(-1), torch.from_numpy(scores))
    assert output.batch["responses"].shape == (6, 512) and output.batch["prompts"].shape == (6, 512)
    assert "rollout_log_probs" in output.batch.keys()

    # What fit() does next, up to the advantages.
    reward_tensor, _ = extract_reward(output)
    output.batch["token_level_scores"] = reward_tensor
    output.batch["token_level_rewards"] = reward_tensor
    output = ray_trainer.compute_advantage(output, adv_estimator="tree_grpo", config=config.algorithm)
    adv, mask = output.batch["advantages"], output.batch["response_mask"]
    expected = tree_grpo_scores(scores.astype(np.float64), list(nt["uid"]), list(nt["tree_uid"]))
    assert torch.allclose(adv, torch.tensor(expected, dtype=torch.float32).unsqueeze(-1) * mask, atol=1e-5)
