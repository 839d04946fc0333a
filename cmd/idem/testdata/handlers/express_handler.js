// A handler for idem consume, with Express (npm install express):
//   node express_handler.js PORT EFFECTS_FILE
// handler.js as an Express app: each message's effect (a line in
// EFFECTS_FILE) applied once per fence, with the fence check of
// docs/consume.md (the fence that wrote for its key: applied already,
// 2xx; one below it: stale, 409).
const express = require("express");
const fs = require("fs");

const fences = new Map(); // key -> the fence of the last write; keep it with the effect in your database
const app = express();
app.use(express.json({ type: () => true })); // the body as received, whatever its Content-Type

app.post("/", (req, res) => {
  const key = req.get("Idempotency-Key");
  const fence = Number(req.get("Idempotency-Fence") || 0);
  const body = req.body || {};
  if (!("amount" in body)) return res.status(400).json({ error: "no amount" }); // terminal: dead-lettered
  const last = fences.get(key) || 0;
  if (fence === last) return res.json({ charged: body.amount }); // applied already: stored, acked
  if (fence < last) return res.status(409).json({ error: "stale fence" }); // retried, then replayed
  fences.set(key, fence);
  fs.appendFileSync(process.argv[3], `${key} ${body.amount}\n`);
  res.json({ charged: body.amount }); // stored; the message is acked
});

app.listen(Number(process.argv[2]), "127.0.0.1");
