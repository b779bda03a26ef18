#!/usr/bin/env python3
"""Instructions per request, counted by callgrind: `/healthz` beside a buyer's
`409 already_purchased` and an anonymous `GET /vouchers/{id}`.

Instruction counts repeat run after run where CPU time on a shared machine
does not, so a change to a refusal's path can be weighed exactly. The
service runs under `valgrind --tool=callgrind` with instrumentation off
while the voucher, the tokens and the buyers' first orders are made; then
each phase of N requests (one keep-alive connection, addresses taking
turns in X-Forwarded-For so no limit fires) is counted alone: counters
zeroed before it, dumped after it. An idle phase as long as a /healthz
phase shows what the background tasks add meanwhile (next to nothing).
Counts are the service's user-space instructions: the kernel's socket work,
the same for every request, is not in them, so the ratios here are above
the CPU-time ratios. Valgrind hides the CPU's SHA extensions: the tokens'
HMAC-SHA256 runs in software here (see the report's `sha256` line).

    cargo build --release -p seckill
    python3 loadtest/callgrind/refusals.py target/release/seckill [N]

Needs valgrind, Postgres at DATABASE_URL's server and Redis at REDIS_URL
(defaults: the local ones); uses a database and a Redis prefix of its own,
dropped at the end. BENCHMARKS.md ("A holder's refusal, counted") shows a run.
"""
import collections
import datetime
import glob
import http.client
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time

BINARY = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
SERVER = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/seckill").rsplit("/", 1)[0]
DATABASE = "seckill_callgrind_%d" % os.getpid()
PREFIX = "callgrind-%d:" % os.getpid()
ADMIN = secrets.token_hex(24)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = free_port()
OUT = tempfile.mkdtemp(prefix="callgrind-")
env = dict(os.environ,
           DATABASE_URL="%s/%s" % (SERVER, DATABASE), SECKILL_ADDR="127.0.0.1:%d" % PORT,
           SECKILL_ADMIN_TOKEN=ADMIN, SECKILL_TOKEN_SECRET=secrets.token_hex(24),
           SECKILL_REDIS_PREFIX=PREFIX, SECKILL_TRUSTED_PROXIES="127.0.0.1",
           SECKILL_SHED_DELAY_MS="0", RUST_LOG="warn")
service = subprocess.Popen(
    ["valgrind", "--tool=callgrind", "--instr-atstart=no",
     "--callgrind-out-file=%s/callgrind.out" % OUT, BINARY, "serve"],
    env=env, stdout=subprocess.DEVNULL, stderr=open("%s/service.log" % OUT, "w"))


def control(*args):
    subprocess.run(["callgrind_control", *args, str(service.pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


conn = None


def request(method, path, body=None, headers=None):
    headers = dict(headers or {})
    if body is not None:
        body = json.dumps(body)
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    answer = conn.getresponse()
    return answer.status, answer.read()


def address(i):
    return "10.0.%d.%d" % (i // 256 % 256, i % 256)


def totals(dump):
    """Instructions by function in one dump (exclusive), and their sum."""
    text = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", dump],
                          capture_output=True, text=True, check=True).stdout
    by_function = collections.Counter()
    for line in text.split("file:function", 1)[-1].splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*)$", line)
        if m:
            name = re.sub(r" \[.*$", "", m.group(2))
            by_function[name.split(":", 1)[-1]] += int(m.group(1).replace(",", ""))
    return by_function


try:
    deadline = time.time() + 600
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
            if request("GET", "/readyz")[0] == 200:
                break
        except OSError:
            pass
        if time.time() > deadline or service.poll() is not None:
            sys.exit("the service did not become ready: see %s/service.log" % OUT)
        time.sleep(2)
    admin = {"Authorization": "Bearer " + ADMIN}
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")
    status, body = request("POST", "/admin/vouchers", {
        "title": "callgrind", "stock": 1_000_000,
        "begin_time": stamp(now - datetime.timedelta(minutes=1)),
        "end_time": stamp(now + datetime.timedelta(hours=2))}, admin)
    assert status in (200, 201), (status, body)
    voucher = json.loads(body)["id"]
    buyers = max(N // 4, 1)  # each asks again 4 times a phase: within the per-user burst
    tokens = []
    for first in range(1, buyers + 1, 500):
        ids = list(range(first, min(first + 500, buyers + 1)))
        status, body = request("POST", "/admin/tokens", {"user_ids": ids}, admin)
        assert status == 200, (status, body)
        tokens += [t["token"] for t in json.loads(body)["tokens"]]
    for i, token in enumerate(tokens):
        status, body = request("POST", "/seckill/%d" % voucher, None,
                               {"Authorization": "Bearer " + token, "X-Forwarded-For": address(i)})
        assert status == 200, (status, body)
    time.sleep(2)  # the orders' own work (events, holders) before counting
    phases = {
        "healthz": lambda i: request("GET", "/healthz", None, {"X-Forwarded-For": address(i)}),
        "already_purchased": lambda i: request(
            "POST", "/seckill/%d" % voucher, None,
            {"Authorization": "Bearer " + tokens[i % buyers], "X-Forwarded-For": address(i)}),
        "voucher_read": lambda i: request("GET", "/vouchers/%d" % voucher, None,
                                          {"X-Forwarded-For": address(i)}),
    }
    want = {"healthz": 200, "already_purchased": 409, "voucher_read": 200}
    control("-i", "on")
    counted = collections.defaultdict(list)
    healthz_seconds = 0.0
    for round_ in range(2):
        for name, send in phases.items():
            control("-z")
            started = time.time()
            statuses = collections.Counter(send(i)[0] for i in range(N))
            seconds = time.time() - started
            control("-d", "%s-%d" % (name, round_))
            assert statuses == {want[name]: N}, (name, statuses)
            healthz_seconds = seconds if name == "healthz" else healthz_seconds
            dump = max(glob.glob("%s/callgrind.out.*" % OUT), key=os.path.getmtime)
            counted[name].append(totals(dump))
            print("%s, round %d: %d x %d in %.1f s" % (name, round_ + 1, N, want[name], seconds),
                  file=sys.stderr)
    control("-z")
    time.sleep(healthz_seconds)
    control("-d", "idle")
    idle = totals(max(glob.glob("%s/callgrind.out.*" % OUT), key=os.path.getmtime))
    per = {name: [sum(c.values()) / N for c in runs] for name, runs in counted.items()}
    base = sum(per["healthz"]) / len(per["healthz"])
    print("instructions per request (service, user space), %d requests a phase, 2 rounds:" % N)
    for name, runs in per.items():
        mean = sum(runs) / len(runs)
        sha = sum(c[f] for c in counted[name] for f in c if "sha256" in f) / N / len(runs)
        print("  %-18s %9.0f  (rounds %s)  %.2fx /healthz  sha256 %.0f" % (
            name, mean, ", ".join("%.0f" % r for r in runs), mean / base, sha))
    print("  idle for one /healthz phase (%.1f s): %.0f in all" % (healthz_seconds, sum(idle.values())))
finally:
    service.terminate()
    try:
        service.wait(timeout=60)
    except subprocess.TimeoutExpired:
        service.kill()
    subprocess.run(["psql", SERVER + "/postgres", "-qc", "DROP DATABASE IF EXISTS %s WITH (FORCE)" % DATABASE],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["sh", "-c", "redis-cli -u \"${REDIS_URL:-redis://127.0.0.1:6379}\" --scan --pattern '%s*' | "
                    "xargs -r redis-cli -u \"${REDIS_URL:-redis://127.0.0.1:6379}\" del" % PREFIX],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
