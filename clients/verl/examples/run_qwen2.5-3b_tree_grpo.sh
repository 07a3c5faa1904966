#!/usr/bin/env bash
# Tree-GRPO (M=2, N=2, L=1, k=3) for Qwen2.5-3B on Search-R1's NQ + HotpotQA data with verl 0.9.1,
# the rollouts grown by a Grove env-server over wiki-18 (BM25). One node, 8 GPUs.
#
#   env-server serve --corpus wiki-18.jsonl --bind 0.0.0.0:8000 &
#   DATA=~/data/nq_hotpotqa_train MODEL=Qwen/Qwen2.5-3B bash run_qwen2.5-3b_tree_grpo.sh
#
# Settings follow the Tree-GRPO paper's QA scripts (shared spec, sections 1.5, 2.8 and 5); the
# tree's per-turn and observation caps (500 tokens) are in grove_agent_loops.yaml. Edit its
# `url` if the env-server is not on this machine.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${DATA:?the folder of Search-R1 nq_hotpotqa_train: train.parquet, test.parquet}
MODEL=${MODEL:-Qwen/Qwen2.5-3B}

python3 -m verl.trainer.main_ppo \
  trainer.use_v1=false \
  algorithm.adv_estimator=tree_grpo \
  algorithm.use_kl_in_reward=false \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=512 \
  data.val_batch_size=128 \
  data.max_prompt_length=4096 \
  data.max_response_length=4096 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=12 \
  actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0.001 \
  actor_rollout_ref.actor.fsdp_config.param_offload=true \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=true \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=24 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=6 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.top_p=0.95 \
  actor_rollout_ref.rollout.prompt_length=4096 \
  actor_rollout_ref.rollout.response_length=4096 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=24 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/grove_agent_loops.yaml" \
  actor_rollout_ref.rollout.agent.default_agent_loop=grove_tree \
  +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=grove_verl.install \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.total_training_steps=180 \
  trainer.total_epochs=2 \
  trainer.test_freq=60 \
  trainer.save_freq=60 \
  trainer.val_before_train=false \
  trainer.logger='["console"]' \
  trainer.project_name=grove-tree-grpo \
  trainer.experiment_name=qwen2.5-3b-nq-hotpotqa-tree-2-2-1-3 \
  "$@"
