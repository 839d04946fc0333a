# idem — make targets. `make test` is what CI runs (see .ci/run).
#
# Modules (see CONTRIBUTING.md): the root and every directory with a go.mod
# are modules, released together at one version (tags vX.Y.Z and
# <dir>/vX.Y.Z). Each requires its siblings at MODVERSION, the next release,
# with no replace directive; go.work maps that version to the working tree,
# so every target here builds the working tree (workspace mode). To add a
# module or a dependency, edit the go.mod (or the imports) and run
# `make tidy`; `make modules` builds and vets every module on its own
# (GOWORK=off) and installs them from a local module proxy.
SHELL    := /bin/bash
GO       ?= go
FUZZTIME ?= 10s
# Every module of the repository (the root and the adapters with heavy
# dependencies, which have go.mod files of their own).
MODULES  := $(shell find . -name go.mod -not -path './.cache/*' -not -path './bin/*' -exec dirname {} \; | sort)
# The version every module requires of its siblings (the next release): the
# one go.work maps to the working tree. make tidy MODVERSION=v0.2.0 moves
# every module to another.
MODVERSION ?= $(shell sed -n 's|^[[:space:]]*github.com/idemgo/idem \(v[^ ]*\) =>.*|\1|p' go.work)
MODPROXY   := $(GO) run -C internal/modproxy .

# The stamp of every build from a git checkout (make build, image, release):
# VERSION is the nearest tag (git describe: v1.2.3, v1.2.3-4-g0123abc past
# it) or the abbreviated commit when no tag is reachable, with -dirty when
# tracked files have changes; COMMIT the full commit; DATE the commit's
# date (so that the same commit gives the same binaries); DIRTY true or
# false. `idem version [--json]` prints them. Outside a checkout: devel.
ifeq ($(origin VERSION),undefined)
VERSION := $(shell git describe --tags --match 'v*' --always --dirty 2>/dev/null || echo devel)
endif
ifeq ($(origin COMMIT),undefined)
COMMIT := $(shell git rev-parse HEAD 2>/dev/null)
endif
ifeq ($(origin DATE),undefined)
DATE := $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
endif
ifeq ($(origin DIRTY),undefined)
DIRTY := $(if $(filter %-dirty,$(VERSION)),true,false)
endif
STAMP := -X main.buildVersion=$(VERSION) -X main.buildCommit=$(COMMIT) -X main.buildDate=$(DATE) -X main.buildDirty=$(DIRTY)

# Tools compiled from the Go module proxy into .cache/tools, once per
# version (the first time takes minutes: helm pulls in the Kubernetes
# client libraries), and the documents the chart is checked against: the
# OpenAPI documents of Kubernetes releases (in the k8s.io/kubernetes
# module, about 20 MB each, fetched once into the module cache) and the
# ServiceMonitor CRD (in the Prometheus Operator's).
TOOLS               := $(CURDIR)/.cache/tools
HELM_VERSION        ?= v3.22.0
KUBECONFORM_VERSION ?= v0.8.0
CYCLONEDX_VERSION   ?= v1.10.0
# The oldest release the chart supports (its preStop sleep) and the newest.
K8S_VERSIONS        ?= v1.30.14 v1.37.2
PROMOP_VERSION      ?= v0.85.0
HELM                := $(TOOLS)/helm-$(HELM_VERSION)
KUBECONFORM         := $(TOOLS)/kubeconform-$(KUBECONFORM_VERSION)
CYCLONEDX           := $(TOOLS)/cyclonedx-gomod-$(CYCLONEDX_VERSION)
# go install/mod download of one version, outside any module.
GOTOOL = cd / && GOWORK=off GOFLAGS=-mod=mod
# The directory of a module version in the module cache, downloaded if
# missing: $(call moddir,path@version).
moddir = $$($(GOTOOL) $(GO) mod download -json $(1) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p')
CHART_ENV = IDEM_HELM=$(HELM) IDEM_KUBECONFORM=$(KUBECONFORM) \
  IDEM_K8S_OPENAPI="$(foreach v,$(K8S_VERSIONS),$(call moddir,k8s.io/kubernetes@$(v))/api/openapi-spec/swagger.json:)" \
  IDEM_SERVICEMONITOR_CRD="$(call moddir,github.com/prometheus-operator/prometheus-operator@$(PROMOP_VERSION))/jsonnet/prometheus-operator/servicemonitors-crd.json"

.PHONY: test vet race modules chaos-suite tidy build release image image-test chart-test stamp-test deploy-test manifests fuzz soak chaos chaos-long chaos-report bench bench-lifecycle bench-instructions bench-streams bench-consume bench-functions bench-http bench-grpc bench-proxy bench-resources bench-postgres check-redis check-brokers check-postgres demo

## test: formatting, vet, the race-enabled tests of every module, each
## module built on its own (make modules), the short variant of the
## reliability suite (make chaos) and the checks of what ships beside the
## code: the image, the chart and the stamped version (make deploy-test).
## After vet, these parts are independent and run JOBS at a time (1 by
## default), the longest first; each part's output is printed whole when
## it ends. The servers are checked once, before: the parts have no
## prerequisites left to wait for, so make starts them in the order given.
## The two chaos scenarios that failed with JOBS=3 on a 2-core machine (a
## port taken between a proxy's stop and its restart, a connection count)
## no longer depend on their neighbours; CI keeps JOBS=1 until whole runs
## with JOBS>1 have passed repeatedly there.
JOBS ?= 1
test: check-redis check-brokers check-postgres vet
	@$(MAKE) --no-print-directory -j$(JOBS) --output-sync=target modules chaos-suite race deploy-test

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
	@big=$$(git ls-files -z 2>/dev/null | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 { print $$2 }'); \
	  if [ -n "$$big" ]; then echo "tracked files over 1 MiB (a built binary?):"; echo "$$big"; exit 1; fi
	@$(MODPROXY) check -version $(MODVERSION) -repo $(CURDIR)
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	@# The library also builds where int has 32 bits.
	GOARCH=386 $(GO) build ./...

## race: the race-enabled tests of every module but the suites that have
## targets of their own, one target per module (race@DIR), so that make -j
## runs modules side by side.
RACE_MODULES := $(filter-out ./chaos ./internal/modproxy ./internal/deploytest,$(MODULES))
race: $(RACE_MODULES:%=race@%)
define race_rule
.PHONY: race@$(1)
race@$(1):
	cd $(1) && $(GO) test -race -count=1 -timeout 15m ./...
endef
$(foreach m,$(RACE_MODULES),$(eval $(call race_rule,$(m))))

## modules: every module as its users get it. A local module proxy serves
## the tree as if each module were tagged at MODVERSION; in an empty GOPATH,
## go install of cmd/idem and go get of every module must work, and every
## module must build and vet on its own (GOWORK=off) with a tidy go.mod.
## Needs the module proxy for third-party modules (minutes: empty cache).
modules:
	cd internal/modproxy && $(GO) test -count=1 -timeout 30m ./...

## tidy: line every module up with MODVERSION (requirements, go.work), then
## go mod tidy each one on its own against a local module proxy of the tree.
## To add a dependency: import it (or go mod edit -require), then make tidy.
tidy:
	$(MODPROXY) sync -version $(MODVERSION) -repo $(CURDIR)
	$(MODPROXY) run -version $(MODVERSION) -repo $(CURDIR) -- $(GO) mod tidy

## chaos: the reliability suite (RELIABILITY.md), short bounded variant, with
## the race detector. RUN=regexp selects scenarios. Each scenario appends its
## counters to CHAOS_REPORT; make chaos-report prints them as a table. One
## package at a time (-p 1): the scenarios measure memory, connections and
## timings that a neighbour scenario's load disturbs. The test binaries are
## built side by side first (chaos/suite.sh), then run one at a time.
RUN          ?= .
CHAOS_REPORT ?= $(CURDIR)/chaos-report.jsonl
chaos: check-redis check-postgres
	@$(MAKE) --no-print-directory chaos-suite
chaos-suite:
	@rm -f $(CHAOS_REPORT)
	GO=$(GO) RUN='$(RUN)' CHAOS_TIMEOUT=20m IDEM_CHAOS_REPORT=$(CHAOS_REPORT) bash chaos/suite.sh

## chaos-long: the same scenarios at soak size (minutes; not run by CI).
chaos-long: check-redis check-postgres
	@rm -f $(CHAOS_REPORT)
	cd chaos && IDEM_CHAOS=long IDEM_CHAOS_REPORT=$(CHAOS_REPORT) $(GO) test -count=1 -timeout 90m -run '$(RUN)' ./...

## chaos-report: the rows of the last chaos run as a Markdown table.
chaos-report:
	cd chaos && $(GO) run ./cmd/chaosreport $(CHAOS_REPORT)

## fuzz: every fuzz target of every module for FUZZTIME each: a duration
## (10s) or a number of executions (20000x, which CI runs: with Go 1.26 a
## duration can end in a spurious "context deadline exceeded",
## golang/go#75804). The targets are found by their declarations
## (func FuzzXxx(f *testing.F) in a _test.go file), not by go test -list
## in every package, which compiled every package's tests (about 4 minutes).
FUZZ_FUNC := ^func (Fuzz([^a-z(][^(]*)?)\(.*testing\.F\)
fuzz:
	@for d in $$(LC_ALL=C grep -rlE --include='*_test.go' --exclude-dir=.cache --exclude-dir=bin \
	    --exclude-dir=testdata --exclude-dir='.?*' --exclude-dir='_*' '$(FUZZ_FUNC)' . | xargs -r -n1 dirname | LC_ALL=C sort -u); do \
	  pkg=$$(cd $$d && $(GO) list .) || exit 1; \
	  for f in $$(LC_ALL=C sed -nE 's/$(FUZZ_FUNC).*/\1/p' $$d/*_test.go); do \
	    echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
	    (cd $$d && $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) .) || exit 1; \
	  done; \
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

## bench-lifecycle: only what the lifecycle targets of make bench need:
## the lifecycle rows of go-redis and rueidis at 64 callers and the
## redis-benchmark ceiling's acquire and complete, with the depth of the
## pipelines the server read (calls per read); 3 runs, about 40 s.
## ARGS='-runs 5 -callers 1,64 -cpuprofile DIR'.
bench-lifecycle: check-redis
	$(GO) run ./internal/benchcmd -lifecycle -callers 64 $(ARGS)

## bench-instructions: redis-server's instructions per new key under
## valgrind's callgrind, idem's acquire + complete (both clients) against
## the floor's two plain SETs; counts do not depend on the machine's load.
## ARGS='-keys 2000 -runs 3 -profiles DIR' (needs valgrind).
bench-instructions: check-redis
	$(GO) run ./internal/benchcmd -callgrind $(ARGS)

## bench-streams: the Redis Streams consumer at batch 100 with idempotency
## ("dedup"), without it ("plain") and with the least Redis work any
## deduplication needs ("floor"), 5 runs each; prints medians and ratios,
## and the CPU time per message of redis-server and of the consumer.
bench-streams: check-redis
	$(GO) test -run '^$$' -bench 'Consumer/.*/batch=100' -benchtime 50000x -count 5 ./consumer/redisstream/ | $(GO) run ./internal/benchratio -metric msgs/s -base plain -also redis-µs/msg,go-µs/msg

## bench-consume: idem consume (the binary, POSTing each message to an HTTP
## handler, "sidecar"; --parallel 100, or IDEM_BENCH_PARALLEL; and each batch
## in one request, --to-batch, "batch") against the Go adapter in process with an empty handler, on the
## same broker and store, batch 100, Redis Streams and RabbitMQ; 3 runs,
## prints the medians of msgs/s and their ratios, the CPU time per message
## of the sidecar and of the test process (handler, or adapter), and the
## p50 of one message at a time from publish to handler.
bench-consume: check-redis check-brokers
	cd cmd/idem && IDEM_BENCH_CONSUME=1 $(GO) test -run '^$$' -bench 'BenchmarkConsume$$' -benchtime 3000x -count 3 . | $(GO) run ../../internal/benchratio -metric msgs/s -base inprocess -also self-cpu-µs/msg,sidecar-cpu-µs/msg,sidecar-peak-rss-MiB
	cd cmd/idem && IDEM_BENCH_CONSUME=1 $(GO) test -run '^$$' -bench 'BenchmarkConsumeLatency' -benchtime 200x -count 3 . | $(GO) run ../../internal/benchratio -metric p50-µs -base inprocess

## bench-functions: the Redis time per call of each transition in script
## mode and in Functions mode (WithFunctions), the two interleaved call by
## call in the same run, and Redis's own cost of EVALSHA, FCALL and
## FCALL_RO on a "return 1" body; 7 runs, prints the medians of the
## Functions/script ratios and of the µs per call.
bench-functions: check-redis
	$(GO) test -run '^$$' -bench Transitions -benchtime 20000x -count 7 ./redisstore/ \
	  | $(GO) run ./internal/benchratio -metric functions/scripts -base none \
	  | $(GO) run ./internal/benchratio -metric scripts-redis-µs/call -base none \
	  | $(GO) run ./internal/benchratio -metric functions-redis-µs/call -base none \
	  | $(GO) run ./internal/benchratio -metric scripts-client-µs/call -base none \
	  | $(GO) run ./internal/benchratio -metric functions-client-µs/call -base none \
	  | $(GO) run ./internal/benchratio -metric fcall/evalsha -base none \
	  | $(GO) run ./internal/benchratio -metric fcall_ro/evalsha -base none \
	  | $(GO) run ./internal/benchratio -metric evalsha-redis-µs/call -base none \
	  | $(GO) run ./internal/benchratio -metric fcall-redis-µs/call -base none \
	  | $(GO) run ./internal/benchratio -metric fcall_ro-redis-µs/call -base none

## bench-grpc: a unary gRPC call over loopback to a bare server and to one
## with the idemgrpc interceptor (memstore), new keys and replays, 1 and 64
## concurrent streams on one connection, beside idemhttp against its bare
## handler in the same run; 5 interleaved rounds, medians and the ratios
## to bare, with the process's CPU time and allocations per call; then the
## interceptor alone, in process (BenchmarkInterceptor).
bench-grpc:
	cd idemgrpc && $(GO) test -c -o $(CURDIR)/bin/idemgrpc.test . && \
	  for i in 1 2 3 4 5; do $(CURDIR)/bin/idemgrpc.test -test.run '^$$' -test.bench 'Unary|HTTP' -test.benchtime 5000x -test.benchmem; done \
	  | $(GO) run ../internal/benchratio -metric calls/s -base bare -paired -also cpu-µs/call,allocs/op && \
	  $(CURDIR)/bin/idemgrpc.test -test.run '^$$' -test.bench 'Interceptor' -test.benchtime 50000x -test.count 3

## bench-http: idemhttp (both Redis clients), Fiber's idempotency middleware
## (and the bare handler on Fiber),
## a plain reverse proxy and the idem proxy against the bare handler under
## wrk (and the proxy over h2c against HTTP/1.1 under a Go load generator,
## and the proxy taking a webhook's key from the body after its
## signature against the same deliveries keyed by header), beside the floors that bound them, interleaved rounds, with the
## ratios of the performance targets (needs wrk; about 10 minutes;
## ARGS=-only=regexp narrows it).
bench-http: check-redis
	@command -v wrk >/dev/null 2>&1 || { echo "wrk is needed: sudo apt-get install -y wrk"; exit 1; }
	$(GO) run ./internal/httpbench $(ARGS)

## bench-proxy: the proxy's new-key throughput on both stores (needs wrk).
bench-proxy: check-redis
	@command -v wrk >/dev/null 2>&1 || { echo "wrk is needed: sudo apt-get install -y wrk"; exit 1; }
	bash internal/httpbench/proxy/run.sh

## bench-resources: the proxy's CPU per 1,000 requests and its resident
## memory at the default limits under wrk, on Redis and the embedded store
## (RUNS=5 runs of DURATION=10s at CONNS="64 256 1024"; medians), the
## figures behind the chart's requests and limits (docs/deploy.md).
bench-resources: check-redis
	@command -v wrk >/dev/null 2>&1 || { echo "wrk is needed: sudo apt-get install -y wrk"; exit 1; }
	bash internal/httpbench/proxy/resources.sh

## bench-postgres: the commit gate side by side in one run: a bare
## transaction, a hand-written idempotency-keys row in the same
## transaction (the anchor), the gate's Postgres part alone (on memstore),
## its Redis part alone, the hybrid gate (Redis + Postgres, with each
## client) and pgstore, with the CPU and WAL bytes per key (needs
## PostgreSQL, see check-postgres; starts its own redis-server).
## ARGS="-modes memgate,hybrid -runs 5" narrows it.
bench-postgres: check-redis check-postgres
	cd postgres && $(GO) run ./internal/pgbench $(ARGS)

## build: bin/idem (BUILD_OUT) from the working tree, stamped (see STAMP).
BUILD_OUT ?= $(CURDIR)/bin/idem
build:
	cd cmd/idem && $(GO) build -ldflags "$(STAMP)" -o $(BUILD_OUT) .

## release: idem for every platform in dist/: idem_<version>_<os>_<arch>.tar.gz
## (.zip for Windows) with the LICENSE, the README, CHANGELOG.md and
## INSTALL.md, SHA256SUMS, and a CycloneDX SBOM per binary
## (idem_<version>_<os>_<arch>.cdx.json, from the modules the binary was
## built with). Static (CGO_ENABLED=0), -trimpath, stamped (see STAMP).
## RELEASE_JOBS platforms are built at once (default: one per core);
## each step prints a line.
PLATFORMS    ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
RELEASE_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
release: $(CYCLONEDX)
	@GO="$(GO)" VERSION="$(VERSION)" COMMIT="$(COMMIT)" DATE="$(DATE)" STAMP="$(STAMP)" \
	  PLATFORMS="$(PLATFORMS)" JOBS="$(RELEASE_JOBS)" CYCLONEDX="$(CYCLONEDX)" \
	  bash internal/release/release.sh

## image: the container image idem:<VERSION> (IMAGE=name:tag for another
## name), built offline with buildah (or podman): FROM scratch, the static
## binary for this machine's architecture and its CA certificates, user
## 65532, /data a volume (deploy/image). IMAGE_TOOL_FLAGS passes global
## flags, e.g. --root DIR --storage-driver vfs. With Docker instead: docker
## build -t idem . (the Dockerfile downloads golang and builds the same).
IMAGE ?= idem:$(VERSION)
image:
	@mkdir -p bin/image
	cd cmd/idem && CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "-s -w $(STAMP)" -o ../../bin/image/idem .
	IDEM_BIN=bin/image/idem IMAGE="$(IMAGE)" VERSION="$(VERSION)" COMMIT="$(COMMIT)" DATE="$(DATE)" \
	  IMAGE_TOOL_FLAGS="$(IMAGE_TOOL_FLAGS)" bash deploy/image/build.sh
	@echo "built $(IMAGE); run it with: podman run --rm $(IMAGE) version"

## deploy-test: image-test, chart-test and stamp-test (part of make test).
deploy-test: image-test chart-test stamp-test

## image-test: builds the image into a storage of its own and runs it with
## podman: idem version, the proxy answering through it in front of an
## upstream on this machine, as user 65532 on a read-only root filesystem
## with its store in the volume (internal/deploytest). Needs buildah,
## podman and runc.
image-test:
	@for t in buildah podman runc; do command -v $$t >/dev/null 2>&1 || { \
	  echo "make image-test needs buildah, podman and runc: sudo apt-get install -y buildah podman runc"; exit 1; }; done
	@mkdir -p bin/image
	cd cmd/idem && CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "-s -w $(STAMP)" -o ../../bin/image/idem .
	cd internal/deploytest && IDEM_IMAGE_BIN=$(CURDIR)/bin/image/idem IDEM_IMAGE_VERSION="$(VERSION)" IDEM_IMAGE_COMMIT="$(COMMIT)" \
	  $(GO) test -count=1 -timeout 5m -run 'TestImage' ./...

## chart-test: helm lint and helm template of deploy/helm/idem with its
## default values and its value sets (ci/), each object checked and
## validated by kubeconform against the schemas of each of K8S_VERSIONS
## and of the ServiceMonitor CRD; deploy/kubernetes must be the chart's
## rendering (make manifests).
chart-test: $(HELM) $(KUBECONFORM)
	cd internal/deploytest && $(CHART_ENV) \
	  $(GO) test -count=1 -timeout 5m -run 'TestChart|TestKubeconform|TestManifests|TestSchemas' ./...

## manifests: rewrite deploy/kubernetes from the chart.
manifests: $(HELM) $(KUBECONFORM)
	cd internal/deploytest && $(CHART_ENV) \
	  $(GO) test -count=1 -run 'TestManifests' ./... -update

## stamp-test: make build stamps bin/idem with what git says of the checkout.
stamp-test:
	cd internal/deploytest && $(GO) test -count=1 -timeout 5m -run 'TestStamp' ./...

$(HELM):
	@mkdir -p $(TOOLS)
	@echo "compiling helm $(HELM_VERSION) from the Go module proxy into .cache/tools (once; minutes)"
	@$(GOTOOL) GOBIN=$(TOOLS) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && mv $(TOOLS)/helm $@
$(KUBECONFORM):
	@mkdir -p $(TOOLS)
	@echo "compiling kubeconform $(KUBECONFORM_VERSION) from the Go module proxy into .cache/tools (once)"
	@$(GOTOOL) GOBIN=$(TOOLS) $(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION) && mv $(TOOLS)/kubeconform $@
$(CYCLONEDX):
	@mkdir -p $(TOOLS)
	@echo "compiling cyclonedx-gomod $(CYCLONEDX_VERSION) from the Go module proxy into .cache/tools (once)"
	@$(GOTOOL) GOBIN=$(TOOLS) $(GO) install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_VERSION) && mv $(TOOLS)/cyclonedx-gomod $@

## demo: the proxy on its embedded store in front of a toy API (no Redis),
## on DEMO_PORT (the proxy) and DEMO_UPSTREAM_PORT (the toy API). Then, in
## another terminal, send the same request twice:
##   curl -si -X POST localhost:8080/payments -H 'Idempotency-Key: k1' -d '{"amount":100}'
DEMO_PORT          ?= 8080
DEMO_UPSTREAM_PORT ?= 9000
demo:
	@echo "building bin/idem (the first build compiles every dependency: about a minute)"
	@cd cmd/idem && $(GO) build -o ../../bin/idem .
	@echo "starting the toy API (not idempotent) on 127.0.0.1:$(DEMO_UPSTREAM_PORT): bin/idem upstream-demo"
	@./bin/idem upstream-demo --listen 127.0.0.1:$(DEMO_UPSTREAM_PORT) & demo=$$!; \
	  trap 'kill $$demo 2>/dev/null' EXIT; \
	  for i in $$(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$(DEMO_UPSTREAM_PORT)) 2>/dev/null && break; sleep 0.05; done; \
	  echo "starting the proxy on 127.0.0.1:$(DEMO_PORT), records in ./idem-data; Ctrl-C stops both. Try:"; \
	  echo "  curl -si -X POST localhost:$(DEMO_PORT)/payments -H 'Idempotency-Key: order-17' -d '{\"amount\":100}'"; \
	  ./bin/idem proxy --listen 127.0.0.1:$(DEMO_PORT) --upstream http://127.0.0.1:$(DEMO_UPSTREAM_PORT) --data ./idem-data
