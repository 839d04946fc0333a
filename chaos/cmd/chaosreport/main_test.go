package main

import (
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	in := `{"scenario":"owner pause","variant":"short","attempted":20,"acknowledged":20,"executed":40,"effects":20,"lost":0,"duplicated":0,"figures":{"stale_rejected":"20/20","a|b":"1"},"command":"make chaos RUN=TestOwnerPause"}
`
	var out strings.Builder
	if err := write(&out, strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	want := "| owner pause | short | 20 | 20 | 40 | 20 | 0 | 0 | a\\|b 1; stale_rejected 20/20 | `make chaos RUN=TestOwnerPause` |"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("got\n%s\nwant a row\n%s", out.String(), want)
	}
	if err := write(&out, strings.NewReader("{not json}\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad line: err = %v, want one naming line 1", err)
	}
}
