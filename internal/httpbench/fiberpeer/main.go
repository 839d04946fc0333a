// Command fiberpeer is the peer that make bench-http measures idem against:
// Fiber v2's idempotency middleware with its Redis storage, in front of the
// same small JSON handler as the other servers of the table; with -bare,
// the handler alone on Fiber, which tells what Fiber's middleware adds
// from what Fiber (fasthttp) costs against net/http. It lives in a
// module of its own so that Fiber never enters idem's dependencies.
//
//	fiberpeer -listen 127.0.0.1:8081 -redis 127.0.0.1:6379
//	fiberpeer -listen 127.0.0.1:8082 -bare
package main

import (
	"errors"
	"flag"
	"log"
	"net"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/gofiber/storage/redis/v3"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	addr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	pool := flag.Int("pool", 128, "Redis connection pool size")
	bare := flag.Bool("bare", false, "serve the handler alone, without the idempotency middleware nor Redis")
	flag.Parse()
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	if !*bare {
		useIdempotency(app, *addr, *pool)
	}
	app.Post("/pay", func(c *fiber.Ctx) error {
		c.Set("Content-Type", "application/json")
		return c.Status(fiber.StatusCreated).SendString(`{"id":"pay_1","status":"succeeded","amount":4200}`)
	})
	log.Fatal(app.Listen(*listen))
}

// useIdempotency puts Fiber's idempotency middleware, on its Redis storage
// at addr, in front of app's handlers.
func useIdempotency(app *fiber.App, addr string, pool int) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		log.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	store := redis.New(redis.Config{Host: host, Port: p, PoolSize: pool})
	app.Use(idempotency.New(idempotency.Config{
		Next:      func(c *fiber.Ctx) bool { return fiber.IsMethodSafe(c.Method()) },
		Lifetime:  24 * time.Hour,
		KeyHeader: "Idempotency-Key",
		// The same keys as the other servers get (Fiber's default wants a UUID).
		KeyHeaderValidate: func(k string) error {
			if k == "" || len(k) > 255 {
				return errors.New("invalid idempotency key")
			}
			return nil
		},
		Storage: store,
	}))
}
