# A handler for idem consume, with the standard library only:
#   python3 handler.py PORT EFFECTS_FILE
# It applies each message's effect (a line in EFFECTS_FILE) once per
# fence, with the fence check of docs/consume.md: a request whose
# Idempotency-Fence is the one that wrote for its key is the same call
# again (its answer was lost: applied already, answer 2xx); one below it
# is stale (its owner lost the key to a newer one: 409).
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

fences = {}  # key -> the fence of the last write; keep it with the effect in your database
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        key = self.headers["Idempotency-Key"]
        fence = int(self.headers.get("Idempotency-Fence", "0"))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if "amount" not in body:
            return self.answer(400, {"error": "no amount"})  # terminal: dead-lettered
        with lock:
            last = fences.get(key, 0)
            if fence == last:
                return self.answer(200, {"charged": body["amount"]})  # applied already: stored, acked
            if fence < last:
                return self.answer(409, {"error": "stale fence"})  # retried, then replayed
            fences[key] = fence
            with open(sys.argv[2], "a") as f:
                f.write(f"{key} {body['amount']}\n")
        self.answer(200, {"charged": body["amount"]})  # stored; the message is acked

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
