#!/usr/bin/env bash
# The server drill of scripts/drills.sh (issue 20): `phasekv serve` under 64 keep-alive clients,
# 40 stalled clients and oversize bodies (chunked 120 MB, Content-Length 10^12), with GET /health
# every 100 ms throughout; then repeated large requests (64 prompts x 360 tokens, echo,
# logprobs 20: 485,184 log-probability entries each, from 4 clients at once) with the server's
# RSS before, during and after (the end at most 1.5 x the first quarter), and one over the cap
# (--max-logprob-entries 500000) refused.
# Prints every figure; exit 1 when a check fails.
#
#   bash scripts/drills_server.sh [--bin build/phasekv] [--model models/lookup-chunked]
#        [--large 24] [--only-large] [--seconds 15]
# MALLOC_ARENA_MAX in the environment reaches the server (serve sets 2 arenas unless it is set).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import argparse, http.client, json, os, random, re, signal, socket, subprocess, sys, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/phasekv")
ap.add_argument("--model", default="models/lookup-chunked")
ap.add_argument("--large", type=int, default=24)
ap.add_argument("--seconds", type=float, default=15)
ap.add_argument("--only-large", action="store_true")
a = ap.parse_args()

failures = []
def check(ok, what):
    print(("  ok    " if ok else "  FAIL  ") + what, flush=True)
    if not ok: failures.append(what)

srv = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", "0", "--torch-threads", "1",
                        "--read-timeout", "2", "--max-logprob-entries", "500000"], stderr=subprocess.PIPE, text=True)
port = None
for line in srv.stderr:
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m.group(1)); break
if port is None: sys.exit("server did not start")
threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()

def rss_mb():
    with open(f"/proc/{srv.pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS:"): return int(l.split()[1]) / 1024
    return 0.0

def request(conn, method, path, body=None):
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse(); data = r.read()
    return r.status, data

stop = threading.Event()
health = {"ok": 0, "fail": 0, "worst": 0.0}
peak = [0.0]
def monitor():
    while not stop.is_set():
        t = time.time()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            s, _ = request(c, "GET", "/health"); c.close()
            health["ok" if s == 200 else "fail"] += 1
        except Exception:
            health["fail"] += 1
        health["worst"] = max(health["worst"], time.time() - t)
        peak[0] = max(peak[0], rss_mb())
        time.sleep(0.1)

rng = random.Random(1)
def prompt(n): return [rng.randrange(3, 77) for _ in range(n)]

print(f"server pid {srv.pid} on port {port}; RSS at start {rss_mb():.0f} MB", flush=True)
mon = threading.Thread(target=monitor); mon.start()

if not a.only_large:
    counts = {}
    lock = threading.Lock()
    def count(kind, status):
        with lock: counts[(kind, status)] = counts.get((kind, status), 0) + 1
    end = time.time() + a.seconds
    def keepalive():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = {"prompt": prompt(100), "max_tokens": 1, "temperature": 0, "echo": True,
                "logprobs": 1, "return_tokens_as_token_ids": True}
        while time.time() < end:
            try: count("keep-alive", request(c, "POST", "/v1/completions", body)[0])
            except Exception as e: count("keep-alive", type(e).__name__)
            time.sleep(0.05)
    def slow():
        while time.time() < end:
            s = socket.create_connection(("127.0.0.1", port)); s.settimeout(10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and nothing more
            try: count("stalled", int(s.recv(4096).split()[1]))
            except Exception as e: count("stalled", type(e).__name__)
            s.close()
    def oversize():
        while time.time() < end:
            s = socket.create_connection(("127.0.0.1", port)); s.settimeout(10)
            t = time.time(); sent = 0
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"100000\r\n" + b" " * (1 << 20) + b"\r\n"
            try:
                while sent < (120 << 20):
                    s.sendall(chunk); sent += 1 << 20
            except OSError: pass
            try: count("chunked 120 MB", int(s.recv(4096).split()[1]))
            except Exception as e: count("chunked 120 MB", type(e).__name__)
            count("chunked MB sent before the cut", sent >> 20)
            s.close()
            s = socket.create_connection(("127.0.0.1", port)); s.settimeout(10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
            try: count("Content-Length 10^12", int(s.recv(4096).split()[1]))
            except Exception as e: count("Content-Length 10^12", type(e).__name__)
            s.close()
            time.sleep(0.5)
    threads = [threading.Thread(target=keepalive) for _ in range(64)]
    threads += [threading.Thread(target=slow) for _ in range(40)]
    threads += [threading.Thread(target=oversize)]
    t0 = time.time()
    for t in threads: t.start()
    for t in threads: t.join()
    print(f"hostile mix, {time.time() - t0:.1f} s: 64 keep-alive clients, 40 stalled, oversize bodies")
    for k in sorted(counts, key=str): print(f"  {k[0]}: {k[1]} x{counts[k]}")
    ka_ok = counts.get(("keep-alive", 200), 0)
    ka_all = sum(v for k, v in counts.items() if k[0] == "keep-alive")
    check(ka_ok == ka_all and ka_ok > 0, f"keep-alive requests all 200 ({ka_ok} of {ka_all})")
    st = sum(v for k, v in counts.items() if k[0] == "stalled")
    check(counts.get(("stalled", 408), 0) == st, f"stalled clients all answered 408 ({st})")
    ch = sum(v for k, v in counts.items() if k[0] == "chunked 120 MB")
    check(counts.get(("chunked 120 MB", 413), 0) == ch and ch > 0, f"chunked 120 MB bodies all 413 ({ch})")
    cl = sum(v for k, v in counts.items() if k[0] == "Content-Length 10^12")
    check(counts.get(("Content-Length 10^12", 413), 0) == cl and cl > 0, f"Content-Length 10^12 all 413 ({cl})")
    print(f"  /health during the mix: {health['ok']} answered, {health['fail']} failed, "
          f"slowest {health['worst'] * 1000:.0f} ms; peak RSS {peak[0]:.0f} MB")
    check(health["fail"] == 0, "/health answered throughout")

# Repeated large requests: RSS before, after each quarter, after all.
big = {"prompt": [prompt(360) for _ in range(64)], "max_tokens": 1, "temperature": 0,
       "echo": True, "logprobs": 20, "return_tokens_as_token_ids": True}
done = [0]; dlock = threading.Lock(); rss = [rss_mb()]; statuses = []
print(f"large requests: {a.large} x (64 prompts x 360 tokens, echo, logprobs 20), 4 clients; "
      f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset (serve sets 2)')}", flush=True)
t0 = time.time()
def large_client():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    while True:
        with dlock:
            if done[0] >= a.large: return
            done[0] += 1
        s, data = request(c, "POST", "/v1/completions", big)
        with dlock:
            statuses.append(s)
            if len(statuses) % max(1, a.large // 4) == 0: rss.append(rss_mb())
ths = [threading.Thread(target=large_client) for _ in range(4)]
for t in ths: t.start()
for t in ths: t.join()
time.sleep(1)
rss.append(rss_mb())
print(f"  {len(statuses)} requests in {time.time() - t0:.0f} s, statuses {sorted(set(statuses))}")
print("  RSS MB: before " + f"{rss[0]:.0f}" + ", after each quarter " +
      ", ".join(f"{x:.0f}" for x in rss[1:-1]) + f", at the end {rss[-1]:.0f}; peak {peak[0]:.0f}")
check(all(s == 200 for s in statuses), "large requests all 200")
# Bounded: after the first quarter (the allocator's working set), RSS grows by at most half again.
check(rss[-1] <= 1.5 * rss[1],
      f"RSS bounded: {rss[-1]:.0f} MB at the end <= 1.5 x {rss[1]:.0f} MB after the first quarter")
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
s, data = request(c, "POST", "/v1/completions", dict(big, prompt=[prompt(480) for _ in range(64)]))
check(s == 400 and b"--max-logprob-entries" in data,
      f"64 prompts x 480 tokens x 21 = 646,464 entries refused (--max-logprob-entries 500000): {s}")
stop.set(); mon.join()
srv.send_signal(signal.SIGTERM)
check(srv.wait(timeout=60) == 0, "SIGTERM: the server stopped with exit 0")
sys.exit(1 if failures else 0)
PY
