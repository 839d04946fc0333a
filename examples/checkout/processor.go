package main

import (
	"fmt"
	"io"
	"net/http"
	"sync"
)

// processor is a toy card processor that honours Idempotency-Key, as real
// ones do: a charge request with a key it has seen is answered with the
// charge it made then, and nothing is charged again. A request without a
// key is charged every time.
//
// loseReply(order) says whether to drop the connection after charging,
// before the reply: the charge happened, the caller does not know.
type processor struct {
	loseReply func(order string) bool

	mu      sync.Mutex
	byKey   map[string]string
	charges map[string]int // per order
	lost    int
}

func newProcessor(loseReply func(order string) bool) *processor {
	return &processor{loseReply: loseReply, byKey: map[string]string{}, charges: map[string]int{}}
}

func (p *processor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	order, key := string(body), r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	id, seen := p.byKey[key]
	if !seen || key == "" {
		id = fmt.Sprintf("ch_%d", len(p.byKey)+1)
		p.charges[order]++
		if key != "" {
			p.byKey[key] = id
		}
	}
	lose := !seen && p.loseReply(order)
	if lose {
		p.lost++
	}
	p.mu.Unlock()
	if lose {
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close() // charged, but the reply is lost
			return
		}
	}
	io.WriteString(w, id)
}

// counts returns how many orders were charged once, how many more than
// once, and how many replies were lost.
func (p *processor) counts() (once, more, lost int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.charges {
		if n == 1 {
			once++
		} else {
			more++
		}
	}
	return once, more, p.lost
}
