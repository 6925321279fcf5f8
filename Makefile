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
# golangci-lint v2 (.golangci.yml: govet, staticcheck, errcheck, sloglint, forbidigo, ...), built
# from the Go module proxy into bin/ on first use; a new version gets a binary of its own.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT         ?= bin/golangci-lint-$(GOLANGCI_LINT_VERSION)

.PHONY: build test lint services-up services-down services-status demo bench bench-peers chaos clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.revision=$(REVISION)" -o $(BIN) ./cmd/coordinator

## test: start the local Redis, Redis Cluster, PostgreSQL and Kafka (and fetch promtool, which the
## alert rules' tests and the live /metrics check in deploy/ run), then run every test against them.
test: services-up
	@set -e; eval "$$(scripts/services env)"; \
	echo "go test $(TEST_FLAGS) ./..."; \
	$(GO) test $(TEST_FLAGS) ./...

## lint: golangci-lint on the main module (bench/ is a module of its own), a gofmt check, and
## go vet of the -tags testhooks (and chaos_sabotage) files, which the linter's production build
## does not see.
lint: $(GOLANGCI_LINT)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GOLANGCI_LINT) run ./...
	$(GO) vet -tags testhooks ./cmd/coordinator ./internal/replica ./internal/billrun
	$(GO) vet -tags testhooks,chaos_sabotage ./cmd/coordinator ./internal/billrun ./internal/trigger

$(GOLANGCI_LINT):
	@mkdir -p bin/.golangci-lint
	GOBIN=$(CURDIR)/bin/.golangci-lint $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv bin/.golangci-lint/golangci-lint $@

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

## chaos: the fault-injection verifier (docs/chaos.md, RELIABILITY.md). It starts its own Redis
## (master, replica, sentinel), PostgreSQL and Kafka on free loopback ports, never the shared ones.
## CHAOS_DURATION seconds of faults (default 120), CHAOS_SEED (default random, printed first),
## CHAOS_OUT (default chaos-out/); exit 0 only when no anomaly was found. CHAOS_SABOTAGE=1 runs it
## against the deliberately unsafe chaos_sabotage build, which must be caught (non-zero exit).
## The coordinator under test is built with -tags testhooks (as for the e2e tests): the product's
## code plus its two test hooks (slower batches, a shorter Kafka session timeout).
CHAOS_DURATION ?= 120
CHAOS_OUT      ?= chaos-out
chaos:
	scripts/services install redis postgres kafka
	$(GO) build -o bin/chaos ./cmd/chaos
	@case "$(CHAOS_SABOTAGE)" in \
	  1|true|yes) tags=testhooks,chaos_sabotage; out=bin/coordinator-sabotage ;; \
	  *)          tags=testhooks;                out=bin/coordinator-chaos ;; \
	esac; \
	echo "$(GO) build -tags $$tags -o $$out ./cmd/coordinator"; \
	$(GO) build -tags $$tags -ldflags "-X main.version=$(VERSION)" -o $$out ./cmd/coordinator
	CHAOS_DURATION="$(CHAOS_DURATION)" CHAOS_SEED="$(CHAOS_SEED)" CHAOS_OUT="$(CHAOS_OUT)" \
	  CHAOS_SABOTAGE="$(CHAOS_SABOTAGE)" CHAOS_FAULTS="$(CHAOS_FAULTS)" CHAOS_RECOVERY="$(CHAOS_RECOVERY)" bin/chaos

## bench: the in-repo Go benchmarks against the local services (figures go to BENCHMARKS.md by hand).
bench: services-up
	@set -e; eval "$$(scripts/services env)"; \
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...

## bench-peers: our lock against Redisson, redsync and bsm/redislock on one Redis (see bench/README.md).
bench-peers:
	bench/run-peers

clean:
	rm -rf bin
