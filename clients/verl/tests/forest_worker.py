"""One agent-loop worker process for test_forest_rollouts.py: runs some rows of one prompt
(the same uid as the other worker) through GroveTreeAgentLoop with SmolLM2 and writes the rows
and what the env-server recorded as JSON.

    python forest_worker.py URL MODEL_DIR LOOPS_YAML UID ROWS OUT.json"""

import asyncio
import json
import pathlib
import sys
import zlib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parents[1] / "python" / "src"))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from forest_checks import Recorder, row_record  # noqa: E402
from grove_verl.agent_loop import close_connections, connection  # noqa: E402
from hf_server import TransformersServer  # noqa: E402
from verl_setup import gen_batch, make_loop, row_kwargs, sampling_params, trainer_config  # noqa: E402


def main():
    url, model_dir, loops_yaml, uid, count, out = sys.argv[1:7]
    gen = TransformersServer(model_dir, seed=zlib.crc32(out.encode()))
    config = trainer_config(model_dir, 6, loops_yaml)
    batch = gen_batch(config, gen.tokenizer)
    batch.non_tensor_batch["uid"] = np.array([uid] * len(batch), dtype=object)
    rows = row_kwargs(batch)[: int(count)]

    async def run():
        recorder = Recorder(await connection(url))
        loops = [make_loop(config, loops_yaml, gen, gen.tokenizer) for _ in rows]
        outs = await asyncio.gather(*(lp.run(sampling_params(config), **row) for lp, row in zip(loops, rows)))
        await close_connections()
        return outs, recorder

    outs, recorder = asyncio.run(run())
    result = {"rows": [row_record(o) for o in outs], **recorder.plain(), "request_ids": [c[0] for c in gen.calls]}
    pathlib.Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
