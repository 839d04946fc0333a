package main

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemgo/idem/webhook"
)

// benchSecret is the Stripe endpoint secret of the webhook rows.
const benchSecret = "whsec_bench"

// signedCount returns how many distinct deliveries a new-key run of a
// signed row gets: more than a run sends (the benchmark stops if a run
// sent as many), and few enough that wrk loads them quickly.
func signedCount() int { return max(50_000, int(15_000*duration.Seconds())) }

// signedLua sends the deliveries of a file, one line each (id,
// Stripe-Signature, body, separated by tabs), in turn; its argument is
// PATH|THREADS, and each of the threads takes every THREADS-th line.
const signedLua = `
local reqs = {}
local n, i = 0, 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  local path, nth = args[1]:match("^(.*)|(%d+)$")
  nth = tonumber(nth)
  local k = 0
  for line in io.lines(path) do
    k = k + 1
    if nth == 1 or (k - 1) % nth == tid - 1 then
      local id, sig, body = line:match("^([^\t]*)\t([^\t]*)\t(.*)$")
      n = n + 1
      reqs[n] = wrk.format("POST", "/pay", {["Idempotency-Key"] = id, ["Stripe-Signature"] = sig, ["Content-Type"] = "application/json"}, body)
    end
  end
end
function request()
  i = i + 1
  if i > n then i = 1 end
  return reqs[i]
end
`

// signedDeliveries writes the deliveries of one run of a signed row, signed
// now with benchSecret: distinct events, or for a replay run one event,
// and returns the file's path.
func signedDeliveries(dir string, replay bool, prefix string) string {
	path := filepath.Join(dir, "signed-"+prefix)
	f, err := os.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	n := signedCount()
	if replay {
		n = 1
	}
	now := time.Now()
	for i := range n {
		id := "evt_" + prefix + "_" + fmt.Sprint(i)
		if replay {
			id = "evt_replayed_" + prefix
		}
		b := fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":4200,"currency":"eur"}}}`, id)
		h, err := webhook.Sign(webhook.Stripe, []byte(benchSecret), id, now, []byte(b))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", id, h.Get("Stripe-Signature"), b)
	}
	if err := w.Flush(); err != nil {
		log.Fatal(err)
	}
	f.Close()
	return path
}

// primeSigned sends the one delivery of a replay file to url.
func primeSigned(url, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	parts := strings.SplitN(strings.TrimSuffix(string(b), "\n"), "\t", 3)
	req, err := http.NewRequest("POST", url+"/pay", strings.NewReader(parts[2]))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", parts[0])
	req.Header.Set("Stripe-Signature", parts[1])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		log.Fatalf("httpbench: priming the replayed delivery on %s: %s", url, resp.Status)
	}
}
