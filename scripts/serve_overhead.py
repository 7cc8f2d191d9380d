#!/usr/bin/env python3
"""Measures what `pagedattn serve` adds on top of the engine: starts the
server, sends CLIENTS concurrent streamed completions (standard library
only), and prints the server's own accounting from /metrics - engine step
time, the engine thread's time outside the engine lock, the HTTP threads'
work - and their ratio (docs/serve.md, pagedattn_server_overhead_ratio).

    scripts/serve_overhead.py build/release/tools/pagedattn [--model tiny] [--clients 32] [--max-tokens 128]
"""
import argparse
import http.client
import json
import re
import subprocess
import threading
import time


def stream_one(port, prompt, max_tokens, errors):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    text = conn.getresponse().read().decode()
    if not text.rstrip().endswith("data: [DONE]"):
        errors.append(text[-200:])


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    values = {}
    for line in conn.getresponse().read().decode().splitlines():
        m = re.match(r"^(pagedattn_[a-z_]+) ([0-9.e+-]+)$", line)
        if m:
            values[m[1]] = float(m[2])
    return values


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    server = subprocess.Popen([a.cli, "serve", "--model", a.model, "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r":(\d+) ", server.stdout.readline())[1])
        errors = []
        start = time.perf_counter()
        threads = [threading.Thread(target=stream_one, args=(port, f"client {i} says", a.max_tokens, errors))
                   for i in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        m = metrics(port)
    finally:
        server.terminate()
        server.wait(timeout=120)
    if errors:
        raise SystemExit(f"{len(errors)} streams failed: {errors[0]}")
    step = m["pagedattn_engine_step_seconds_total"]
    outside = m["pagedattn_engine_thread_step_seconds_total"] - step
    http_work = m["pagedattn_http_handler_seconds_total"]
    tokens = a.clients * a.max_tokens
    print(f"{a.clients} streamed clients x {a.max_tokens} tokens on {a.model}: {wall:.2f} s wall, "
          f"{tokens / wall:.0f} tokens/s")
    print(f"engine step (lock held) {step:.3f} s, model {m['pagedattn_engine_model_seconds_total']:.3f} s, "
          f"idle {m['pagedattn_engine_thread_idle_seconds_total']:.3f} s")
    print(f"engine thread outside the lock {outside:.4f} s "
          f"(callbacks {m['pagedattn_engine_thread_callback_seconds_total']:.4f} s), HTTP work {http_work:.4f} s")
    print(f"overhead ratio {m['pagedattn_server_overhead_ratio']:.4f} "
          f"(engine thread {outside / step:.4f} + HTTP {http_work / step:.4f})")


if __name__ == "__main__":
    main()
