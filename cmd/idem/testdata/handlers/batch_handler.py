# A batch handler for idem consume --to-batch, with the standard library only:
#   python3 batch_handler.py PORT EFFECTS_FILE
# Each request is a JSON array of messages; the answer is a JSON array of
# one outcome per message, in the same order. Each message gets the fence
# check of docs/consume.md, as in handler.py.
import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

fences = {}  # key -> the fence of the last write; keep it with the effect in your database
lock = threading.Lock()


def handle(m):
    raw = base64.b64decode(m["body"]) if m["encoding"] == "base64" else m["body"].encode()
    body = json.loads(raw or b"{}")
    if "amount" not in body:
        return {"status": 400, "body": json.dumps({"error": "no amount"})}  # terminal: dead-lettered
    charged = {"status": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps({"charged": body["amount"]})}
    key, fence = m["key"], m.get("fence", 0)
    with lock:
        last = fences.get(key, 0)
        if fence == last:
            return charged  # applied already: stored, acked
        if fence < last:
            return {"status": 409, "body": json.dumps({"error": "stale fence"})}  # retried, then replayed
        fences[key] = fence
        with open(sys.argv[2], "a") as f:
            f.write(f"{key} {body['amount']}\n")
    return charged  # stored; the message is acked


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        messages = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = json.dumps([handle(m) for m in messages]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
