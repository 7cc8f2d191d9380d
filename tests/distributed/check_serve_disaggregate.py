#!/usr/bin/env python3
"""ctest: `mpirun -np 2 pagedattn serve --disaggregate` (rank 0 serves and
decodes, rank 1 prefills) answers over HTTP what `pagedattn serve` alone
answers (both with --deterministic): concurrent requests (greedy and seeded
sampling), n > 1, a stream, also through a decode cache too small for all of
them at once (the tiny preset); a client that leaves mid-stream is aborted
and leaves no KV page in use; bench-serve --url runs against it (--bench, a
GGUF model); SIGUSR1 to mpirun and SIGINT to rank 0 both end mpirun with
status 0.

  check_serve_disaggregate.py --cli pagedattn --mpirun mpirun [--model tiny] [--bench] [--ranks 2]
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

TIMEOUT = 60  # seconds for any one wait


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


class Server:
    """A `serve` process (or mpirun running one) listening on a free port."""

    def __init__(self, command, name):
        self.name = name
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     start_new_session=True)
        self.port = None
        found = threading.Event()

        def read_port():
            for line in self.proc.stdout:
                m = re.search(r"on http://[^:]+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    found.set()

        threading.Thread(target=read_port, daemon=True).start()
        if not found.wait(TIMEOUT):
            self.kill()
            fail(f"{name} printed no port:\n{self.stderr()}")

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def request(self, path, body=None, timeout=TIMEOUT):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read().decode()
        conn.close()
        if response.status != 200:
            fail(f"{self.name}: {path} answered {response.status}: {data}")
        return data

    def complete(self, body):
        return json.loads(self.request("/v1/completions", body))

    def metric(self, name):
        m = re.search(rf"^{name} (\S+)$", self.request("/metrics"), re.M)
        if not m:
            fail(f"{self.name}: no metric {name}")
        return float(m.group(1))

    def stop(self, sig, pid=None):
        os.kill(pid or self.proc.pid, sig)
        try:
            return self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            fail(f"{self.name} did not stop on signal {sig}:\n{self.stderr()}")

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def choices(response):
    return [(c["text"], c["finish_reason"]) for c in sorted(response["choices"],
                                                         key=lambda c: c["index"])]


def requests():
    prompts = ["The quick brown fox", "Once upon a time, in a land far away,", "1, 2, 3, 4,",
               "Paged attention keeps the KV cache in fixed-size pages " * 4, "Hi", "abc" * 30]
    out = []
    for i, prompt in enumerate(prompts):
        body = {"prompt": prompt, "max_tokens": 8 + 3 * i, "temperature": 0, "ignore_eos": True}
        if i % 2 == 1:  # seeded sampling: equal too, every token depends on the KV
            body.update(temperature=1.0, seed=100 + i)
        out.append(body)
    # Parallel samples: rank 1 draws each one's first token, rank 0 forks the prompt.
    out.append({"prompt": "Two samples of", "max_tokens": 10, "temperature": 1.0, "seed": 7,
                "n": 2, "ignore_eos": True})
    # Logprobs: the logits stay where they are made, so rank 0 prefills this one itself.
    out.append({"prompt": "With logprobs", "max_tokens": 6, "temperature": 0, "logprobs": 2,
                "ignore_eos": True})
    return out


def concurrently(server, bodies):
    results = [None] * len(bodies)

    def one(i):
        results[i] = server.complete(bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    if any(r is None for r in results):
        fail("a concurrent request got no answer")
    return results


def stream_text(server, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    text, finish = "", None
    for line in response:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        text += choice["text"]
        finish = choice["finish_reason"] or finish
    conn.close()
    return text, finish


def leave_mid_stream(server):
    """Reads two events of a long stream, then closes the connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    conn.request("POST", "/v1/completions",
                 json.dumps({"prompt": "A long story:", "max_tokens": 4000, "stream": True,
                             "ignore_eos": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    events = 0
    while events < 2:
        if response.readline().decode().startswith("data: "):
            events += 1
    conn.sock.close()
    conn.close()


def wait_until(condition, what):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    fail(f"timed out waiting until {what}")


def rank0_pid(mpirun_pid):
    """The rank-0 process under mpirun (OMPI_COMM_WORLD_RANK=0 in its environment)."""
    for _ in range(TIMEOUT * 10):
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if ppid == mpirun_pid and b"OMPI_COMM_WORLD_RANK=0" in env:
                return int(pid)
        time.sleep(0.1)
    fail("no rank-0 process under mpirun")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--ranks", type=int, default=2, help="mpirun -np: rank 0 and N-1 prefill ranks")
    # bench-serve --url sends token ids of a real model's vocabulary: not for the presets.
    ap.add_argument("--bench", action="store_true", help="also run bench-serve --url --quick")
    args = ap.parse_args()
    # Deterministic kernels: a request's tokens do not depend on what runs
    # beside it, so concurrent requests (and long seeded samples) can be
    # compared with requests sent one at a time.
    serve = [args.cli, "serve", "--model", args.model, "--port", "0", "--deterministic"]
    disagg = [args.mpirun, "-np", str(args.ranks), "--oversubscribe"] + serve + ["--disaggregate"]

    alone = Server(serve, "serve")
    bodies = requests()
    expected = [choices(alone.complete(b)) for b in bodies]  # one at a time
    # The tiny preset: longer outputs for a decode cache too small to hold
    # them all at once (a real model keeps its cache and the short outputs).
    small_cache = args.model == "tiny"
    long_bodies = [dict(b, max_tokens=64) for b in bodies] if small_cache else bodies
    expected_long = [choices(alone.complete(b)) for b in long_bodies] if small_cache else expected
    if alone.stop(signal.SIGINT) != 0:
        fail(f"serve exited non-zero:\n{alone.stderr()}")

    server = Server(disagg, "serve --disaggregate")
    try:
        got = [choices(r) for r in concurrently(server, bodies)]
        for i, (e, g) in enumerate(zip(expected, got)):
            if e != g:
                fail(f"request {i} {bodies[i]}:\n  serve:               {e}\n"
                     f"  serve --disaggregate: {g}")
        text, finish = stream_text(server, bodies[0])
        if (text, finish) != expected[0][0]:
            fail(f"the stream gave {(text, finish)}, serve alone {expected[0][0]}")
        leave_mid_stream(server)
        wait_until(lambda: server.metric("pagedattn_client_aborts_total") >= 1,
                   "the server noticed the client that left")
        wait_until(lambda: server.metric("pagedattn_requests_in_flight") == 0
                   and server.metric("pagedattn_kv_pages_used") == 0,
                   "no request and no KV page is left in use")
        if args.bench:
            bench = subprocess.run([args.cli, "bench-serve", "--url",
                                    f"http://127.0.0.1:{server.port}", "--quick",
                                    "--num-requests", "8"], capture_output=True, text=True,
                                   timeout=TIMEOUT * 3)
            completed = re.search(r"completed requests\s+8 of 8", bench.stdout)
            if bench.returncode != 0 or not completed:
                fail(f"bench-serve --url exited {bench.returncode}:\n{bench.stdout}{bench.stderr}")
            print(bench.stdout, end="")
            if choices(server.complete(bodies[0])) != expected[0]:
                fail("after bench-serve the server answers differently")
    except BaseException:
        server.kill()
        print(server.stderr(), file=sys.stderr)
        raise
    rc = server.stop(signal.SIGUSR1)
    log = server.stderr()
    if rc != 0 or "stopped" not in log:
        fail(f"SIGUSR1 to mpirun: exit status {rc}:\n{log}")
    print(log, end="")

    # A decode cache of 1 MiB (32 pages of the tiny preset; the longest
    # request grows to 18): offers wait on rank 0 until requests finish, and
    # running ones are preempted (an imported prompt is then recomputed on rank 0).
    small = disagg + ["--kv-memory-mib", "1"] if small_cache else disagg
    server = Server(small, "serve --disaggregate with a small cache")
    got = [choices(r) for r in concurrently(server, long_bodies)]
    if got != expected_long:
        server.kill()
        fail(f"with a small decode cache:\n  serve:                {expected_long}\n"
             f"  serve --disaggregate: {got}")
    rc = server.stop(signal.SIGINT, rank0_pid(server.proc.pid))
    print(server.stderr(), end="")
    if rc != 0:
        fail(f"SIGINT to rank 0: mpirun exit status {rc}:\n{server.stderr()}")
    print("serve --disaggregate answered as serve alone; SIGUSR1 to mpirun and SIGINT to rank 0 "
          "both ended mpirun with status 0")


if __name__ == "__main__":
    main()
