"""A tiny installed harness for the capture-proxy tests (issue 18): it runs INSIDE the sandbox with the image's
python3 and its standard library only, calls its model through ``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY`` (as
coding CLIs do), runs the bash commands the model asks for, and ends at the first reply without one.

    python3 harness.py INSTRUCTION       the agent loop ("[stream]" in the instruction: streamed calls)
    python3 harness.py probe PORT        what the sandbox reaches: writes /tmp/probe.json
    python3 harness.py leftover          waits for /tmp/go, then makes one call; writes its HTTP status to
                                         /tmp/leftover.txt (a process left running between turns)
    python3 harness.py anthropic         one Anthropic Messages call through $ANTHROPIC_BASE_URL, with
                                         $ANTHROPIC_API_KEY as x-api-key; prints the reply's text
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
KEY = os.environ.get("OPENAI_API_KEY", "")
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a bash command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def post(body, key=KEY):
    request = urllib.request.Request(BASE + "/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    return urllib.request.urlopen(request, timeout=600)


def status_of(body, key=KEY):
    try:
        with post(body, key) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return "error: %s" % exc


def call(messages, stream):
    body = {"model": "policy", "messages": messages, "tools": TOOLS}
    if stream:
        body["stream"] = True
    with post(body) as answer:
        if not stream:
            return json.load(answer)["choices"][0]["message"]
        content, calls = "", {}
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                delta = choice.get("delta") or {}
                content += delta.get("content") or ""
                for tc in delta.get("tool_calls") or []:
                    slot = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
        return {"role": "assistant", "content": content or None, "tool_calls": [calls[i] for i in sorted(calls)]}


def agent(instruction):
    stream = "[stream]" in instruction
    messages = [{"role": "user", "content": instruction}]
    for _ in range(20):
        reply = call(messages, stream)
        tool_calls = reply.get("tool_calls") or []
        if not tool_calls:
            print(reply.get("content"))
            return 0
        messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": tool_calls})
        for tc in tool_calls:
            command = json.loads(tc["function"]["arguments"])["command"]
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": done.stdout + done.stderr})
    return 1


def reaches(host, port):
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return True
    except OSError:
        return False


def probe(other_port):
    proxy = urllib.parse.urlsplit(BASE)
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    found = {"proxy_port": reaches(proxy.hostname, proxy.port),
             "gateway_other_port": reaches(proxy.hostname, other_port),
             "outside": reaches("192.0.2.1", 80),  # TEST-NET-1: never routed; a sandbox must have no route at all
             "forged_token": status_of(body, key="forged-" + KEY[::-1])}
    with open("/tmp/probe.json", "w") as f:
        json.dump(found, f)
    print(json.dumps(found))


def leftover():
    for _ in range(600):
        if os.path.exists("/tmp/go"):
            break
        time.sleep(0.2)
    got = status_of({"model": "policy", "messages": [{"role": "user", "content": "leftover"}]})
    with open("/tmp/leftover.txt", "w") as f:
        f.write(str(got))


def anthropic():
    body = {"model": "policy", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01",
                                              "x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")})
    with urllib.request.urlopen(request, timeout=600) as answer:
        print("anthropic:", "".join(b.get("text", "") for b in json.load(answer)["content"]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        probe(sys.argv[2])
    elif sys.argv[1:2] == ["leftover"]:
        leftover()
    elif sys.argv[1:2] == ["anthropic"]:
        anthropic()
    else:
        sys.exit(agent(sys.argv[1]))
