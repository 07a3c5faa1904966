"""The example agents run end to end against the real env-server (the OpenAI one against a
scripted stand-in for a chat-completions endpoint)."""

import http.server
import importlib.util
import json
import pathlib
import subprocess
import sys
import threading

from grove_client import Client, task

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rule_agent_plays_and_prints_rewards(server):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "rule_agent.py"), server], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum(1 for line in lines if line.startswith("episode ")) == 3
    # The first result for the bridge question is the bridge's own article, not its designer.
    assert "'Elmsworth Harbor Bridge'" in lines[0]
    assert lines[-1].startswith("mean score ")


def test_rule_agent_reads_the_first_title():
    agent = _load("rule_agent")
    text = '\n\n<information>Doc 1(Title: "Ada Kerrigan") Ada was...\nDoc 2(Title: "X") y\n</information>\n\n'
    assert agent.first_title(text) == "Ada Kerrigan"
    assert agent.first_title("nothing") == ""


class _ScriptedChat(http.server.BaseHTTPRequestHandler):
    """Answers /v1/chat/completions with the next scripted reply, as servers honouring `stop` do
    (the closing tag is left off), and records what it was sent."""

    script = []
    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, self.headers.get("Authorization"), body))
        content = type(self).script.pop(0)
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_openai_agent_react_loop(server):
    agent = _load("openai_agent")
    _ScriptedChat.script = [
        "<think>I should look this up.</think>\n<search> Elmsworth Harbor Bridge designer",
        "<think>The bridge was designed by Ada Kerrigan.</think>\n<answer> Ada Kerrigan",
    ]
    _ScriptedChat.seen = []
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _ScriptedChat)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        with Client(server) as env:
            spec = task("who designed the Elmsworth Harbor Bridge?", ["Ada Kerrigan"])
            reward = agent.play(env, spec, base, "scripted", "sk-test")
    finally:
        httpd.shutdown()
        thread.join()
    assert reward["metric_value"] == 1.0 and reward["score"] == 1.0
    assert len(_ScriptedChat.seen) == 2
    path, auth, first = _ScriptedChat.seen[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test" and first["model"] == "scripted"
    # The second call carries the model's search (closed again) and the env's information block.
    second = _ScriptedChat.seen[1][2]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"].endswith("</search>")
    assert second[2]["content"].startswith("\n\n<information>")
