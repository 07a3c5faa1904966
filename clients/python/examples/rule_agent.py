"""A rule-based agent: search the question, answer with the first result's title.

    python clients/python/examples/rule_agent.py ws://127.0.0.1:8000/ [--token T] [--tasks tasks.jsonl]

`--tasks` is a JSONL file of {"question", "golden_answers", "data_source"?} objects; without it a
few questions about the wiki-18 sample corpus are played.
"""

import argparse
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))

from grove_client import Client, GroveError, task  # noqa: E402

DEFAULT_TASKS = [
    task("who designed the Elmsworth Harbor Bridge?", ["Ada Kerrigan"], task_id="demo-0"),
    task("which canal joins the River Lark to the Tollmouth basin?", ["Lark Canal"], task_id="demo-1"),
    task("where did Ada Kerrigan study?", ["Quill Institute of Technology"], task_id="demo-2"),
]

FIRST_TITLE = re.compile(r'Doc 1\(Title: "?([^")]*)"?\)')


def first_title(observation_text):
    m = FIRST_TITLE.search(observation_text)
    return m.group(1).strip() if m else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", nargs="?", default="ws://127.0.0.1:8000/")
    ap.add_argument("--token", default=None)
    ap.add_argument("--tasks", type=pathlib.Path, default=None)
    args = ap.parse_args()
    tasks = DEFAULT_TASKS
    if args.tasks:
        tasks = [json.loads(line) for line in args.tasks.read_text().splitlines() if line.strip()]

    total = 0.0
    with Client(args.url, token=args.token, name="rule-agent") as env:
        starts = env.create_episodes(tasks, raise_errors=False)
        for spec, start in zip(tasks, starts):
            if isinstance(start, GroveError):
                print(f"skipped {spec['question']!r}: {start}")
                continue
            ep = start["episode"]
            obs = env.step(ep, f"<think>I will look it up.</think>\n<search> {spec['question']} </search>")
            guess = first_title(obs["text"])
            obs = env.step(ep, f"<think>The first result is {guess}.</think>\n<answer> {guess} </answer>")
            reward = obs["reward"]
            total += reward["score"]
            print(f"episode {ep}: {spec['question']!r} -> {guess!r}: score {reward['score']:.2f} "
                  f"({reward['metric']} {reward['metric_value']:.2f})")
            env.close(ep)
    print(f"mean score {total / max(1, len(tasks)):.3f}")


if __name__ == "__main__":
    main()
