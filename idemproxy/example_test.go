package idemproxy_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// A Go program embeds the idempotent proxy in front of an API that is not
// idempotent: the second request with the same key gets the first
// response, and the API ran once.
func Example() {
	var charges atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges.Add(1))
	}))
	defer api.Close()

	// The embedding.
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	target, _ := url.Parse(api.URL)
	srv := httptest.NewServer(&idemproxy.Proxy{Target: target, Executor: exec})
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "order-17")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get("Idempotent-Replayed"), string(body))
	}
	// Output:
	// 201  charge 1
	// 201 true charge 1
}

// A program that serves the proxy on 127.0.0.1:8080 in front of an API on
// 127.0.0.1:9000, with its records in Redis, which several such proxies
// may share.
func Example_listen() {
	store, err := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	upstream, _ := url.Parse("http://127.0.0.1:9000")
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", &idemproxy.Proxy{Target: upstream, Executor: exec}))
}
