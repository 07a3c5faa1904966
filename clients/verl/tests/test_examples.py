"""The examples are valid for verl 0.9.1: every override of the run script composes verl's
`ppo_trainer` config, and the agent-loop YAML gives settings that fit its rollout.n."""

import pathlib
import shlex

import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grove_verl.config import GroveLoopConfig

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def script_overrides(tmp_path):
    text = (EXAMPLES / "run_qwen2.5-3b_tree_grpo.sh").read_text()
    body = text.split("verl.trainer.main_ppo \\\n", 1)[1].split('"$@"', 1)[0]
    body = body.replace("$DATA", str(tmp_path)).replace("$MODEL", "Qwen/Qwen2.5-3B").replace("$HERE", str(EXAMPLES))
    return shlex.split(body.replace("\\\n", " "))


def test_run_script_overrides_compose(tmp_path):
    overrides = script_overrides(tmp_path)
    assert "algorithm.adv_estimator=tree_grpo" in overrides and "trainer.use_v1=false" in overrides
    config_dir = pathlib.Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    rollout = config.actor_rollout_ref.rollout
    assert rollout.n == 6 and rollout.agent.default_agent_loop == "grove_tree"
    assert config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == "grove_verl.install"
    loops = OmegaConf.load(rollout.agent.agent_loop_config_path)
    [entry] = [e for e in loops if e.name == "grove_tree"]
    assert entry._target_ == "grove_verl.agent_loop.GroveTreeAgentLoop"
    settings = GroveLoopConfig.from_mapping(entry.grove, rollout_n=rollout.n)
    assert settings.shape(rollout.n) == (2, 2, 1, 3)
