// A handler for idem consume, with Node's http module only:
//   node handler.js PORT EFFECTS_FILE
// It applies each message's effect (a line in EFFECTS_FILE) once per
// fence, with the fence check of docs/consume.md: a request whose
// Idempotency-Fence is the one that wrote for its key is the same call
// again (its answer was lost: applied already, answer 2xx); one below it
// is stale (its owner lost the key to a newer one: 409).
const http = require("http");
const fs = require("fs");

const fences = new Map(); // key -> the fence of the last write; keep it with the effect in your database

function answer(res, status, obj) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify(obj));
}

http
  .createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const key = req.headers["idempotency-key"];
      const fence = Number(req.headers["idempotency-fence"] || 0);
      let body = {};
      try {
        body = JSON.parse(Buffer.concat(chunks).toString() || "{}");
      } catch {}
      if (!("amount" in body)) return answer(res, 400, { error: "no amount" }); // terminal: dead-lettered
      const last = fences.get(key) || 0;
      if (fence === last) return answer(res, 200, { charged: body.amount }); // applied already: stored, acked
      if (fence < last) return answer(res, 409, { error: "stale fence" }); // retried, then replayed
      fences.set(key, fence);
      fs.appendFileSync(process.argv[3], `${key} ${body.amount}\n`);
      answer(res, 200, { charged: body.amount }); // stored; the message is acked
    });
  })
  .listen(Number(process.argv[2]), "127.0.0.1");
