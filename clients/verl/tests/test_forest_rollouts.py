"""GroveTreeAgentLoop against a real env-server over the wiki-18 sample corpus, generating with
SmolLM2-135M-Instruct on the CPU (tests/hf_server.py stands in for verl's inference server;
everything else is verl's own: config, dataset rows, agent-loop construction, run() contract).

One prompt, Tree-GRPO shape (M=2, N=2, L=1, k=3): the 6 rows run concurrently in one process,
then split over two processes; chain GRPO with 4 rows. Each time the rows must form the trees the
env-server recorded, every continuation's prefix must be its parent's tokens byte for byte, and
each row's reward must be the env-server's."""

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pytest

from forest_checks import Recorder, check_forest, row_record
from grove_verl.agent_loop import close_connections, connection, unpack_step_data
from verl_setup import gen_batch, make_loop, row_kwargs, sampling_params, trainer_config, write_loops_yaml

# Small turns keep a CPU run to a few minutes: 2 tool turns, 32 tokens per turn.
SMALL = dict(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=64)
TREE = (2, 2, 1, 3)


@pytest.fixture(scope="module")
def gen(smollm2_dir):
    from hf_server import TransformersServer

    return TransformersServer(smollm2_dir, seed=1234)


def run_rows(server, config, loops_yaml, gen, rows):
    async def main():
        recorder = Recorder(await connection(server))
        try:
            loops = [make_loop(config, loops_yaml, gen, gen.tokenizer) for _ in rows]
            outs = await asyncio.gather(*(lp.run(sampling_params(config), **row) for lp, row in zip(loops, rows)))
        finally:
            await close_connections()
        return outs, recorder

    return asyncio.run(main())


def test_tree_rows_in_one_process(server, smollm2_dir, gen, tmp_path):
    loops = write_loops_yaml(tmp_path / "loops.yaml", server, mode="tree", m=2, n=2, l=1, k=3, **SMALL)
    config = trainer_config(smollm2_dir, 6, loops)
    rows = row_kwargs(gen_batch(config, gen.tokenizer))
    assert len(rows) == 6 and len({str(r["uid"]) for r in rows}) == 1
    gen.calls.clear()
    outs, rec = run_rows(server, config, loops, gen, rows)
    check_forest([row_record(o) for o in outs], rec.joined, rec.rewards, TREE)
    key = str(rows[0]["uid"])
    # Generation requests are sticky per tree.
    assert {c[0] for c in gen.calls} == {f"{key}/0", f"{key}/1"}
    # Every inherited step carries the data its parent stored: the ids whose text is the action.
    inherited = [step for o in outs for step in rec.joined[o.extra_fields["grove_episode"]]["steps"]]
    for step in inherited:
        ids, logprobs = unpack_step_data(step["data"])
        assert gen.tokenizer.decode(ids, skip_special_tokens=True) == step["action"] and len(logprobs) == len(ids)


def test_tree_rows_split_over_two_processes(server, smollm2_dir, tmp_path):
    loops = write_loops_yaml(tmp_path / "loops.yaml", server, mode="tree", m=2, n=2, l=1, k=3, **SMALL)
    uid = str(uuid.uuid4())
    worker = os.path.join(os.path.dirname(__file__), "forest_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs, outs = [], []
    for i in range(2):
        out = tmp_path / f"worker{i}.json"
        outs.append(out)
        procs.append(
            subprocess.Popen(
                [sys.executable, worker, server, str(smollm2_dir), str(loops), uid, "3", str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    for p in procs:
        log, _ = p.communicate(timeout=900)
        assert p.returncode == 0, log.decode(errors="replace")[-4000:]
    results = [json.loads(o.read_text()) for o in outs]
    rows = [r for res in results for r in res["rows"]]
    joined = {int(ep): t for res in results for ep, t in res["joined"].items()}
    rewards = {int(ep): r for res in results for ep, r in res["rewards"].items()}
    assert all(len(res["rows"]) == 3 for res in results)
    check_forest(rows, joined, rewards, TREE)
    assert {r["extra"]["grove_key"] for r in rows} == {uid}


def test_chain_rows_are_all_roots(server, smollm2_dir, gen, tmp_path):
    loops = write_loops_yaml(tmp_path / "loops.yaml", server, mode="chain", **SMALL)
    config = trainer_config(smollm2_dir, 4, loops)
    rows = row_kwargs(gen_batch(config, gen.tokenizer, question_id="train_1"))
    outs, rec = run_rows(server, config, loops, gen, rows)
    records = [row_record(o) for o in outs]
    check_forest(records, rec.joined, rec.rewards, (4, 0, 0, 1))
    assert sorted(o.extra_fields["grove_tree"] for o in outs) == [0, 1, 2, 3]
    assert all(o.extra_fields["grove_round"] == 0 for o in outs)
    assert len({o.extra_fields["tree_uid"] for o in outs}) == 4
