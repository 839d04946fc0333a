// A handler for idem consume --gate, with pg from npm (npm install pg):
//   node gate_handler.js PORT DATABASE_URL
// Its effect (a row in payments) and the key's completion row commit in
// one transaction, so the effect happens once per key even when idem's
// store lost the key's record or a paused owner comes back.
const http = require("http");
const { Pool } = require("pg");

const pool = new Pool({ connectionString: process.argv[3] });

// The completion row: digest, fence, result, retention in seconds.
const COMPLETE = `INSERT INTO idem_completions AS c (digest, fingerprint, fence, result, expires_at, relayed)
VALUES ($1, '', $2, $3, now() + $4 * interval '1 second', true)
ON CONFLICT (digest) DO UPDATE SET fence = excluded.fence, result = excluded.result,
  created_at = now(), expires_at = excluded.expires_at, progress = NULL
WHERE c.expires_at <= now()`;

async function handle(headers, body) {
  if (!("amount" in body)) return [400, { error: "no amount" }]; // terminal: dead-lettered
  const result = { charged: body.amount };
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const done = await client.query(COMPLETE, [
      headers["idempotency-digest"],
      headers["idempotency-fence"],
      Buffer.from(JSON.stringify(result)),
      headers["idem-retention"],
    ]);
    if (done.rowCount === 0) {
      await client.query("ROLLBACK"); // the effect committed with another delivery
      return [409, { error: "committed by another delivery" }]; // retried: acked from the row
    }
    await client.query("INSERT INTO payments (key, amount) VALUES ($1, $2)", [headers["idempotency-key"], body.amount]);
    await client.query("COMMIT");
    return [200, result];
  } catch (err) {
    await client.query("ROLLBACK");
    throw err;
  } finally {
    client.release();
  }
}

http
  .createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      let status = 500;
      let obj = {};
      try {
        [status, obj] = await handle(req.headers, JSON.parse(Buffer.concat(chunks).toString() || "{}"));
      } catch (err) {
        obj = { error: String(err) }; // 500: retried
      }
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(obj));
    });
  })
  .listen(Number(process.argv[2]), "127.0.0.1");
