"""A ReAct agent over any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, OpenAI, ...).

    python clients/python/examples/openai_agent.py --base-url http://127.0.0.1:8080/v1 --model my-model \
        --env ws://127.0.0.1:8000/ --question "who designed the Elmsworth Harbor Bridge?" --answer "Ada Kerrigan"

The model sees the env's prompt as the user message; each reply is sent to the env as a text
action (the Search-R1 tags), and each observation comes back as the next user message, until
the episode is done. Only the standard library is used for HTTP. The API key is taken from
--api-key or $OPENAI_API_KEY, if any.
"""

import argparse
import json
import os
import pathlib
import sys
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))

from grove_client import Client, task  # noqa: E402


def chat(base_url, model, messages, api_key=None, temperature=0.0, max_tokens=512, timeout=120):
    """One `/chat/completions` call; returns the assistant's text."""
    body = {
        "model": model,
        "messages": messages,
        "temperature": temperature,
        "max_tokens": max_tokens,
        # Stop after a tool call so the env, not the model, writes the <information> block.
        "stop": ["</search>", "</answer>"],
    }
    req = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        reply = json.load(resp)
    return reply["choices"][0]["message"].get("content") or ""


def close_tag(text):
    """Servers that honour `stop` drop the stop sequence itself; put the closing tag back."""
    for tag in ("search", "answer"):
        opened, closed = text.rfind(f"<{tag}>"), text.rfind(f"</{tag}>")
        if opened > closed:
            return text + f"</{tag}>"
    return text


def play(env, spec, base_url, model, api_key):
    [start] = env.create_episodes([spec])
    ep = start["episode"]
    messages = [{"role": "user", "content": start["prompt"]}]
    while True:
        text = close_tag(chat(base_url, model, messages, api_key))
        print(f"[model] {text.strip()}")
        obs = env.step(ep, text)
        if obs["done"]:
            return obs["reward"]
        print(f"[env]   {obs['text'].strip()[:300]}")
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": obs["text"]})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    ap.add_argument("--env", default="ws://127.0.0.1:8000/", help="env-server WebSocket URL")
    ap.add_argument("--token", default=None, help="env-server bearer token")
    ap.add_argument("--question", default="who designed the Elmsworth Harbor Bridge?")
    ap.add_argument("--answer", action="append", default=None, help="gold answer (repeatable)")
    ap.add_argument("--data-source", default="nq")
    args = ap.parse_args()
    spec = task(args.question, args.answer or ["Ada Kerrigan"], data_source=args.data_source)
    with Client(args.env, token=args.token, name=f"openai-agent/{args.model}") as env:
        reward = play(env, spec, args.base_url, args.model, args.api_key)
    print(f"reward: score {reward['score']:.2f}, {reward['metric']} {reward['metric_value']:.2f}, "
          f"answer {reward['answer']!r}, format_valid {reward['format_valid']}")


if __name__ == "__main__":
    main()
