package idemproxy

import (
	"strings"
	"testing"

	"github.com/idemgo/idem/keysource"
)

// TestKeySource checks a proxy whose key is a member of the JSON body and
// whose fingerprint covers some members only: one upstream execution per
// event id, a field outside the fingerprint changes nothing, one inside is
// a mismatch, and a body without the member gets 400 and never reaches
// the upstream.
func TestKeySource(t *testing.T) {
	u := newUpstream(t)
	src, err := keysource.Parse("json:/id")
	if err != nil {
		t.Fatal(err)
	}
	fp, err := keysource.ParseFingerprint("json:/type,/data")
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, &Proxy{Target: u.target(t), Executor: newExecutor(t), KeySource: src, Fingerprint: fp}) + "/hooks"
	first := send(t, "POST", url, "", []byte(`{"id":"evt_1","type":"a","data":{"x":1},"attempt":1}`))
	if first.status != 201 {
		t.Fatalf("first: got %d %q", first.status, first.body)
	}
	again := send(t, "POST", url, "", []byte(`{"attempt":2,"data":{"x":1},"type":"a","id":"evt_1"}`))
	if again.status != 201 || again.body != first.body || !again.replayed() {
		t.Errorf("redelivery: got %d %q replayed=%v, want the replay of %q", again.status, again.body, again.replayed(), first.body)
	}
	changed := send(t, "POST", url, "", []byte(`{"id":"evt_1","type":"a","data":{"x":2}}`))
	if changed.status != 422 {
		t.Errorf("a change inside the fingerprint: got %d, want 422", changed.status)
	}
	for _, body := range []string{`{"type":"a"}`, `not json`} {
		if res := send(t, "POST", url, "", []byte(body)); res.status != 400 || !strings.Contains(res.body, "key-missing") {
			t.Errorf("%s: got %d %q, want 400 key-missing", body, res.status, res.body)
		}
	}
	if n := u.executions(""); n != 1 {
		t.Errorf("upstream executions: got %d, want 1", n)
	}
	if res := send(t, "POST", url, "", []byte(`{"id":"evt_2","type":"a"}`)); res.status != 201 || res.replayed() {
		t.Errorf("another event: got %d replayed=%v", res.status, res.replayed())
	}
}
