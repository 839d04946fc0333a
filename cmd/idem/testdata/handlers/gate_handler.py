# A handler for idem consume --gate, with psycopg2 (Debian's python3-psycopg2):
#   python3 gate_handler.py PORT DATABASE_URL
# Its effect (a row in payments) and the key's completion row commit in
# one transaction, so the effect happens once per key even when idem's
# store lost the key's record or a paused owner comes back.
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2

# The completion row: digest, fence, result, retention in seconds.
COMPLETE = """INSERT INTO idem_completions AS c (digest, fingerprint, fence, result, expires_at, relayed)
VALUES (%s, '', %s, %s, now() + %s * interval '1 second', true)
ON CONFLICT (digest) DO UPDATE SET fence = excluded.fence, result = excluded.result,
  created_at = now(), expires_at = excluded.expires_at, progress = NULL
WHERE c.expires_at <= now()"""


class Committed(Exception):
    """Another delivery of the key committed first."""


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if "amount" not in body:
            return self.answer(400, {"error": "no amount"})  # terminal: dead-lettered
        result = json.dumps({"charged": body["amount"]}).encode()
        conn = psycopg2.connect(sys.argv[2])
        try:
            with conn:  # one transaction: committed at the end of the block, rolled back on an exception
                with conn.cursor() as cur:
                    cur.execute(COMPLETE, (self.headers["Idempotency-Digest"], int(self.headers["Idempotency-Fence"]),
                                           result, int(self.headers["Idem-Retention"])))
                    if cur.rowcount == 0:
                        raise Committed()  # roll back: the effect committed with the other delivery
                    cur.execute("INSERT INTO payments (key, amount) VALUES (%s, %s)",
                                (self.headers["Idempotency-Key"], body["amount"]))
        except Committed:
            return self.answer(409, {"error": "committed by another delivery"})  # retried: acked from the row
        finally:
            conn.close()
        self.answer(200, {"charged": body["amount"]})

    def answer(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
