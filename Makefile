# One entry point for building, testing and running the coordinator.
# `make demo` and `make test` each start (and where missing install) what they need.

GO        ?= go
BIN       ?= bin/coordinator
DEMO_BIN  ?= bin/coordinator-demo
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The whole suite on 2 cores stays well inside this bound.
TEST_TIMEOUT ?= 12m
TEST_FLAGS   ?= -count=1 -timeout $(TEST_TIMEOUT)
STATICCHECK  ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: build test lint services-up services-down services-status demo bench bench-peers clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.revision=$(REVISION)" -o $(BIN) ./cmd/coordinator

## test: start the local Redis, Redis Cluster, PostgreSQL and Kafka, then run every test against them.
test: services-up
	@set -e; eval "$$(scripts/services env)"; \
	echo "go test $(TEST_FLAGS) ./..."; \
	$(GO) test $(TEST_FLAGS) ./...

## lint: go vet, a gofmt check, and staticcheck (installed from the module proxy on first use).
lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) run $(STATICCHECK) ./...

services-up:
	scripts/services up

services-down:
	scripts/services down

services-status:
	scripts/services status

## demo: the whole mission on local defaults (see README): installs redis-server and PostgreSQL
## from Debian's packages when missing, then runs three replicas against a throwaway cluster.
## The demo (and its in-process Kafka) is a program of its own, not part of the production binary.
demo:
	$(GO) build -o $(DEMO_BIN) ./cmd/coordinator-demo
	scripts/services install redis postgres
	$(DEMO_BIN) $(DEMO_FLAGS)

## bench: the in-repo Go benchmarks against the local services (figures go to BENCHMARKS.md by hand).
bench: services-up
	@set -e; eval "$$(scripts/services env)"; \
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...

## bench-peers: our lock against Redisson, redsync and bsm/redislock on one Redis (see bench/README.md).
bench-peers:
	bench/run-peers

clean:
	rm -rf bin
