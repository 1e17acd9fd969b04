# The README's two commands are `make run` and `make test`. Everything the tests
# need (a Consul agent built from the Go module proxy) is installed by `make test`
# itself, so a fresh machine passes.
SHELL := /bin/bash
export GOTOOLCHAIN := local
GO ?= go
PKGS := ./...
FUZZTIME ?= 10s

.PHONY: run test deps lint unit fuzz bench-smoke consul bench soak build

build:
	$(GO) build -o bin/sharelimit ./cmd/sharelimit

run:
	$(GO) run ./cmd/sharelimit serve --config-dir examples/config

# consul builds (once, cached under ~/.cache/sharelimit) the agent the
# membership and e2e tests run.
consul:
	@tools/consul/install.sh >/dev/null

test: deps consul lint unit fuzz bench-smoke

# deps installs the Debian packages the tests use when a machine lacks them
# (as root; nothing is installed when all are there): systemd-analyze checks
# the example unit, flock serialises the Consul build, Chromium loads the
# status page in TestStatusPageInBrowser (about 50 s to install, with the
# apt-get update, on a machine without it), and the interop suite (interop/)
# drives the daemon with clients written elsewhere: nghttp2-client (h2load,
# nghttp), python3-grpcio (gRPC C-core, for /usr/bin/python3), curl, and
# Node with npm. `npm ci` then installs @grpc/grpc-js under
# interop/node_modules, as interop/package-lock.json pins it, unless
# `npm ls` finds that tree already there.
deps:
	@missing=""; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v flock >/dev/null || missing="$$missing util-linux"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	{ command -v h2load && command -v nghttp; } >/dev/null || missing="$$missing nghttp2-client"; \
	/usr/bin/python3 -c 'import grpc' 2>/dev/null || missing="$$missing python3-grpcio"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [[ -n "$$missing" ]]; then \
	  echo "deps: installing$$missing"; \
	  apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	fi
	@cd interop && { npm ls --all >/dev/null 2>&1 || npm ci --ignore-scripts --no-audit --no-fund --loglevel=error; }

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@# go.mod must say what the code imports: -diff prints what tidy would change
	@# and exits non-zero.
	$(GO) mod tidy -diff

unit:
	SHARELIMIT_CONSUL_BIN="$$(tools/consul/install.sh)" $(GO) test -race -shuffle=on -count=1 -timeout 15m $(PKGS)

# Every fuzz target runs for a short fixed time. A failure that wrote a failing
# input under testdata/fuzz/ replays it and fails the run. go test -fuzz can
# also fail without any input to blame (a worker that does not stop within its
# second when the time is up, on a loaded machine): that is reported with the
# fuzzer's own output and the target runs once more, and a second failure fails
# the run.
fuzz:
	@set -e; out=$$(mktemp); trap 'rm -f $$out' EXIT; \
	for t in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$t/*_test.go | sed 's/func //'); do \
	    echo "fuzz $$t $$f ($(FUZZTIME))"; \
	    if $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$t >$$out 2>&1; then continue; fi; \
	    grep -v '^fuzz: elapsed' $$out | tail -20; \
	    if [[ -n "$$(git status --porcelain -- $$t/testdata/fuzz)" ]]; then $(GO) test -run "^$$f$$" $$t; exit 1; fi; \
	    echo "fuzz $$t $$f: failed with no failing input; once more"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$t >$$out 2>&1 || { grep -v '^fuzz: elapsed' $$out | tail -40; exit 1; }; \
	  done; \
	done

# Benchmarks run once each, only to prove they still run (a benchmark that
# skips or fails breaks the build). The figures come from `make bench`.
bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 1x $(PKGS) | grep -E '^(Benchmark|ok|FAIL|---)' ; test $${PIPESTATUS[0]} -eq 0

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 3 ./descriptors/... ./server/...

# soak is not part of CI: ten minutes of mixed load on three daemons with a real
# Consul, reloads every 20 s and a node leaving and rejoining every 30 s; it
# fails if goroutines or heap grow, or any request fails.
soak: consul
	$(GO) run ./tools/soak -duration $${SOAK_DURATION:-10m}
