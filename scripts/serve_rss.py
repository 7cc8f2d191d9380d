#!/usr/bin/env python3
"""Resident memory of `pagedattn serve` over large request bodies: starts
`pagedattn serve --model tiny`, sends N large bodies (kind mixed alternates
arrays nested 48 deep side by side with a prompt near the body size) and
prints the server's VmRSS at checkpoints (docs/benchmarks.md).
usage: scripts/serve_rss.py BINARY BODY_BYTES N [kind: mixed|nested|prompt|deep]"""
import http.client, json, re, subprocess, sys, time

binary, body_bytes, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kind = sys.argv[4] if len(sys.argv) > 4 else "mixed"

def nested_body(size):
    nest = "[" * 48 + "]" * 48
    head = '{"prompt": "x", "max_tokens": 1, "padding": [' + nest
    k = max(0, (size - len(head) - 3) // (len(nest) + 1))
    return head + ("," + nest) * k + "]}"

def prompt_body(size):
    return json.dumps({"prompt": "a" * (size - 40), "max_tokens": 1})

def deep_body(size):  # one nest as deep as the body allows (refused by the fix)
    d = (size - 40) // 2
    return '{"prompt": "x", "x": ' + "[" * d + "]" * d + "}"

bodies = {"nested": [nested_body(body_bytes)], "prompt": [prompt_body(body_bytes)],
          "mixed": [nested_body(body_bytes), prompt_body(body_bytes)],
          "deep": [deep_body(body_bytes)]}[kind]
proc = subprocess.Popen([binary, "serve", "--model", "tiny", "--port", "0", "--kv-memory-mib", "4",
                         "--max-body-bytes", str(body_bytes + 4096)],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
line = proc.stdout.readline()
port = int(re.search(r":(\d+) ", line).group(1))

def rss_mib():
    with open(f"/proc/{proc.pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS:"):
                return int(l.split()[1]) / 1024

statuses = {}
start = time.time()
print(f"{kind} bodies of {body_bytes} bytes; start RSS {rss_mib():.0f} MiB", flush=True)
checkpoints = {10, 24, 50, 100, 200, 500, 1000, n}
for i in range(1, n + 1):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", body=bodies[(i - 1) % len(bodies)],
              headers={"Content-Type": "application/json"})
    r = c.getresponse(); r.read(); c.close()
    statuses[r.status] = statuses.get(r.status, 0) + 1
    if i in checkpoints:
        print(f"after {i:5d} requests: RSS {rss_mib():7.0f} MiB  ({time.time() - start:.0f} s, statuses {statuses})", flush=True)
proc.terminate(); proc.wait()
