"""verl's own pieces, put together the way its trainer does (verl 0.9.1): the Hydra config
`ppo_trainer`, rows from `RLHFDataset` over the Search-R1 sample parquet repeated rollout.n times
(`ray_trainer.RayPPOTrainer.fit`), and agent loops built from an `agent_loop_config_path` YAML
entry with `hydra.utils.instantiate` (`AgentLoopWorker._run_agent_loop`)."""

import pathlib
import uuid

import hydra
import numpy as np
import verl
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

FIXTURES = pathlib.Path(__file__).resolve().parents[4] / "shared" / "fixtures"
SEARCHR1 = FIXTURES / "searchr1-sample.parquet"
EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def trainer_config(model_dir, n, loops_yaml=None, response_length=1024, prompt_length=512, overrides=()):
    """verl's composed `ppo_trainer` config for a run with rollout.n = n."""
    config_dir = pathlib.Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        args = [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.n={n}",
            f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
            f"actor_rollout_ref.rollout.response_length={response_length}",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            f"data.train_files={SEARCHR1}",
            f"data.val_files={SEARCHR1}",
            f"data.max_prompt_length={prompt_length}",
            f"data.max_response_length={response_length}",
        ]
        if loops_yaml is not None:
            args += [
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_yaml}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=grove_tree",
            ]
        return compose(config_name="ppo_trainer", overrides=args + list(overrides))


def write_loops_yaml(path, url, **grove):
    """The agent-loop YAML of examples/grove_agent_loops.yaml with this test's settings."""
    entries = yaml.safe_load((EXAMPLES / "grove_agent_loops.yaml").read_text())
    for entry in entries:
        entry["grove"].update({"url": url, **grove})
    pathlib.Path(path).write_text(yaml.safe_dump(entries))
    return path


def gen_batch(config, tokenizer, question_id="train_0", n=None, repeat=True):
    """The generation batch of one prompt, as RayPPOTrainer.fit hands it to the agent-loop
    manager: the dataset row, a fresh uid, repeated rollout.n times (interleaved; `repeat=False`:
    the batch before that)."""
    dataset = RLHFDataset(data_files=[str(SEARCHR1)], tokenizer=tokenizer, config=config.data)
    rows = [dataset[i] for i in range(len(dataset))]
    row = next(r for r in rows if r["id"] == question_id)
    batch = DataProto.from_single_dict(collate_fn([row]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4())], dtype=object)
    if not repeat:
        return batch
    return batch.repeat(repeat_times=n or config.actor_rollout_ref.rollout.n, interleave=True)


def row_kwargs(batch):
    """Each row's `run(**kwargs)`, as AgentLoopWorker.generate_sequences builds them."""
    return [{k: v[i] for k, v in batch.non_tensor_batch.items()} for i in range(len(batch))]


def sampling_params(config):
    """AgentLoopWorker.generate_sequences' sampling parameters (training, not validation)."""
    rollout = config.actor_rollout_ref.rollout
    return dict(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        repetition_penalty=1.0,
        logprobs=rollout.calculate_log_probs,
    )


def make_loop(config, loops_yaml, server_manager, tokenizer, name="grove_tree"):
    """One agent loop, built like AgentLoopWorker._run_agent_loop builds it (one per row)."""
    entry = next(e for e in OmegaConf.load(loops_yaml) if e.name == name)
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=server_manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="llama",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
