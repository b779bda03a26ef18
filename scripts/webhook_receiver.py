#!/usr/bin/env python3
"""A receiver of seckill's order events, in the standard library only.

Checks each delivery's signature (X-Seckill-Signature: t=<unix>,v1=<hex
HMAC-SHA256 of "<t>.<raw body>">, compared in constant time, t within five
minutes), prints each event as one JSON line, and acknowledges with 204.
Deliveries are at least once: a real receiver keeps the ids it has handled
and skips repeats. The guide's "Plugging into a shop" shows it; a test runs it.

    SECKILL_WEBHOOK_SECRET=... scripts/webhook_receiver.py PORT
"""
import hashlib
import hmac
import http.server
import json
import os
import sys
import time

SECRET = os.environ["SECKILL_WEBHOOK_SECRET"].encode()
TOLERANCE_SECONDS = 300  # an older signature may be a replay


def verified(header, body):
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    t, v1 = fields.get("t", ""), fields.get("v1", "")
    if not t.isdigit() or abs(time.time() - int(t)) > TOLERANCE_SECONDS:
        return False
    expected = hmac.new(SECRET, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, v1)


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not verified(self.headers.get("X-Seckill-Signature", ""), body):
            self.send_response(400)
            self.end_headers()
            return
        for event in json.loads(body)["events"]:
            print(json.dumps(event), flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Receiver).serve_forever()
