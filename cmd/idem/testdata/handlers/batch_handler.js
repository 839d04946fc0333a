// A batch handler for idem consume --to-batch, with Node's http module only:
//   node batch_handler.js PORT EFFECTS_FILE
// Each request is a JSON array of messages; the answer is a JSON array of
// one outcome per message, in the same order. Each message gets the fence
// check of docs/consume.md, as in handler.js.
const http = require("http");
const fs = require("fs");

const fences = new Map(); // key -> the fence of the last write; keep it with the effect in your database

function handle(m) {
  const raw = m.encoding === "base64" ? Buffer.from(m.body, "base64").toString() : m.body;
  let body = {};
  try {
    body = JSON.parse(raw || "{}");
  } catch {}
  if (!("amount" in body)) return { status: 400, body: JSON.stringify({ error: "no amount" }) }; // terminal: dead-lettered
  const charged = { status: 200, headers: { "Content-Type": "application/json" }, body: JSON.stringify({ charged: body.amount }) };
  const fence = m.fence || 0;
  const last = fences.get(m.key) || 0;
  if (fence === last) return charged; // applied already: stored, acked
  if (fence < last) return { status: 409, body: JSON.stringify({ error: "stale fence" }) }; // retried, then replayed
  fences.set(m.key, fence);
  fs.appendFileSync(process.argv[3], `${m.key} ${body.amount}\n`);
  return charged; // stored; the message is acked
}

http
  .createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const messages = JSON.parse(Buffer.concat(chunks).toString());
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify(messages.map(handle)));
    });
  })
  .listen(Number(process.argv[2]), "127.0.0.1");
