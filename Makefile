# idem — make targets. `make test` is what CI runs (see .ci/run).
SHELL    := /bin/bash
GO       ?= go
# Each module is built and tested on its own, as its users build it (its
# go.mod replaces the root module with ../..); go.work is for editors.
export GOWORK := off
FUZZTIME ?= 10s
# Every module of the repository (the root and the adapters with heavy
# dependencies, which have go.mod files of their own).
MODULES  := $(shell find . -name go.mod -not -path './.cache/*' -not -path './bin/*' -exec dirname {} \; | sort)

.PHONY: test vet race fuzz soak chaos chaos-long chaos-report bench bench-streams bench-functions bench-http bench-proxy bench-postgres check-redis check-brokers check-postgres demo

## test: formatting, vet, the race-enabled tests of every module and the
## short variant of the reliability suite (make chaos).
test: check-redis check-brokers check-postgres vet race chaos

check-redis:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { \
	  echo "redis-server and redis-cli are needed by the integration tests (each test starts its own servers)."; \
	  echo "Install them with: sudo apt-get install -y redis-server"; exit 1; }

# The RabbitMQ and NATS adapters (and their reliability scenarios) run
# against real brokers on loopback; their tests fail when none answers.
check-brokers:
	@(exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null || { \
	  echo "RabbitMQ is needed on 127.0.0.1:5672 (guest/guest) by consumer/rabbitmq and chaos/brokercrash."; \
	  echo "Install and start it with: sudo apt-get install -y rabbitmq-server && sudo rabbitmq-server -detached"; exit 1; }
	@(exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null || { \
	  echo "nats-server with JetStream is needed on 127.0.0.1:4222 by consumer/nats and chaos/brokercrash."; \
	  echo "Install and start it with: sudo apt-get install -y nats-server && nats-server -a 127.0.0.1 -p 4222 -js &"; exit 1; }

# The postgres module (pggate, pgstore) and its scenarios run against a
# real PostgreSQL; each test makes a schema of its own and drops it.
IDEM_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
export IDEM_POSTGRES_URL
check-postgres:
	@(exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null || { \
	  echo "PostgreSQL is needed on 127.0.0.1:5432 (trust auth, user postgres, database test) by the postgres module."; \
	  echo "Start it with: pg_ctlcluster --skip-systemctl-redirect \$$(ls /etc/postgresql) main start"; \
	  echo "(install it first with: sudo apt-get install -y postgresql)"; exit 1; }

vet:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

race:
	@for m in $(filter-out ./chaos,$(MODULES)); do (cd $$m && $(GO) test -race -count=1 -timeout 15m ./...) || exit 1; done

## chaos: the reliability suite (RELIABILITY.md), short bounded variant, with
## the race detector. RUN=regexp selects scenarios. Each scenario appends its
## counters to CHAOS_REPORT; make chaos-report prints them as a table.
RUN          ?= .
CHAOS_REPORT ?= $(CURDIR)/chaos-report.jsonl
chaos: check-redis
	@rm -f $(CHAOS_REPORT)
	cd chaos && IDEM_CHAOS_REPORT=$(CHAOS_REPORT) $(GO) test -race -count=1 -timeout 20m -run '$(RUN)' ./...

## chaos-long: the same scenarios at soak size (minutes; not run by CI).
chaos-long: check-redis
	@rm -f $(CHAOS_REPORT)
	cd chaos && IDEM_CHAOS=long IDEM_CHAOS_REPORT=$(CHAOS_REPORT) $(GO) test -count=1 -timeout 90m -run '$(RUN)' ./...

## chaos-report: the rows of the last chaos run as a Markdown table.
chaos-report:
	cd chaos && $(GO) run ./cmd/chaosreport $(CHAOS_REPORT)

## fuzz: every fuzz target of every module for FUZZTIME each: a duration
## (10s) or a number of executions (20000x, which CI runs: with Go 1.26 a
## duration can end in a spurious "context deadline exceeded",
## golang/go#75804).
fuzz:
	@for m in $(MODULES); do \
	  (cd $$m && for pkg in $$($(GO) list ./...); do \
	    for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	      echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
	      $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	    done; \
	  done) || exit 1; \
	done

## soak: the consumers' proof tests with SOAK_MESSAGES messages each
## (the default test run uses 10,000).
SOAK_MESSAGES ?= 50000
soak: check-redis
	@for m in . $$(ls -d consumer/*/ | grep -v redisstream); do \
	  echo "soak $$m ($(SOAK_MESSAGES) messages)"; \
	  (set -o pipefail; cd $$m && IDEM_PROOF_MESSAGES=$(SOAK_MESSAGES) $(GO) test -count=1 -timeout 30m -run 'Proof' -v ./... | grep -E '^(ok|FAIL|---)|lost') || exit 1; \
	done

## bench: the benchmark table (starts its own redis-server).
bench: check-redis
	$(GO) run ./internal/benchcmd

## bench-streams: the Redis Streams consumer at batch 100 with idempotency
## ("dedup"), without it ("plain") and with the least Redis work any
## deduplication needs ("floor"), 5 runs each; prints medians and ratios.
bench-streams: check-redis
	$(GO) test -run '^$$' -bench 'Consumer/.*/batch=100' -benchtime 50000x -count 5 ./consumer/redisstream/ | $(GO) run ./internal/benchratio -metric msgs/s -base plain

## bench-functions: the Redis time per call of each transition in script
## mode and in Functions mode (WithFunctions), 7 runs each; prints medians
## and the Functions/script ratios.
bench-functions: check-redis
	$(GO) test -run '^$$' -bench Transitions -benchtime 20000x -count 7 ./redisstore/ | $(GO) run ./internal/benchratio -metric redis-µs/call -base scripts | $(GO) run ./internal/benchratio -metric redis-cpu-µs/call -base scripts

## bench-http: idemhttp against the bare handler under wrk (needs wrk).
bench-http: check-redis
	@command -v wrk >/dev/null 2>&1 || { echo "wrk is needed: sudo apt-get install -y wrk"; exit 1; }
	$(GO) run ./internal/httpbench

## bench-proxy: the proxy's new-key throughput on both stores (needs wrk).
bench-proxy: check-redis
	@command -v wrk >/dev/null 2>&1 || { echo "wrk is needed: sudo apt-get install -y wrk"; exit 1; }
	bash internal/httpbench/proxy/run.sh

## demo: the proxy on its embedded store in front of a toy API (no Redis).
## Then, in another terminal, send the same request twice:
##   curl -si -X POST localhost:8080/payments -H 'Idempotency-Key: k1' -d '{"amount":100}'
demo:
	cd cmd/idem && $(GO) build -o ../../bin/idem .
	@./bin/idem upstream-demo --listen 127.0.0.1:9000 & demo=$$!; \
	  trap 'kill $$demo 2>/dev/null' EXIT; \
	  for i in $$(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/9000) 2>/dev/null && break; sleep 0.05; done; \
	  ./bin/idem proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:9000 --data ./idem-data
