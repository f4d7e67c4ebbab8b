# Ephemeral's build. The two commands the README promises:
#   make demo   replays the product page's run (an agent in a real microVM),
#               then serves the web app
#   make test   runs every test, VM, root and browser tests included
# Both install what they need (Debian packages, the guest image) first.

GO        ?= go
STATE_DIR ?= /var/lib/ephemeral
export EPHEMERAL_STATE_DIR := $(STATE_DIR)
export CGO_ENABLED := 0

STATICCHECK_VERSION = v0.8.2
# 1.34 is the newest Redocly CLI that runs on Debian 12's own Node.js (18);
# npx caches it after the first run.
REDOCLY_VERSION = 1.34.20

.PHONY: build deps image demo serve check openapi-lint test fuzz bench clean

build:
	$(GO) build -trimpath -o bin/ephemeral-init ./guest/cmd/ephemeral-init
	$(GO) build -trimpath -o bin/ephemeral ./tools/ephemeral

deps:
	./tools/install-deps.sh

# Cached by content hash: only rebuilt when an input changed.
image: deps build
	bin/ephemeral image build

# The product page's run, replayed: the model's turns come from the shipped
# recording, every command really runs in a fresh microVM, through the runs
# service and ledger on SQLite. Needs no API key. Then the daemon serves the
# API and the web app, and prints the URL to open.
demo: image
	bin/ephemeral run --replay examples/product-page.json
	@echo
	@echo "Next, the web app: watch the run replay, register and run the example yourself."
	bin/ephemeral serve

# The daemon alone: the API and the web app.
serve: image
	bin/ephemeral serve

# Static checks: vet, formatting and staticcheck must report nothing.
check:
	$(GO) vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt -l: not formatted:"; echo "$$out"; exit 1; fi
	GOBIN=$(CURDIR)/bin/tools $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	bin/tools/staticcheck ./...

# The API's OpenAPI document against Redocly's recommended rules
# (hostd/api/redocly.yaml says which one is off, and why). Needs node and
# npm, which tools/install-deps.sh installs where they are missing.
openapi-lint:
	REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
		npx --yes @redocly/cli@$(REDOCLY_VERSION) lint --config hostd/api/redocly.yaml hostd/api/openapi.json

# EPHEMERAL_REQUIRE_VM turns the VM and root tests' "skip" into failures:
# here everything they need has just been installed and built. Then the
# store, ledger and API suites run once more against PostgreSQL (a
# throwaway cluster each test binary starts itself): one store, two dialects.
test: check image
	EPHEMERAL_REQUIRE_VM=1 $(GO) test -count=1 -timeout 40m ./...
	EPHEMERAL_TEST_DATABASE=postgres $(GO) test -count=1 -timeout 20m ./hostd/store/ ./hostd/ledger/ ./hostd/api/

# Every fuzz target in the repository, one after another for FUZZTIME each
# (tools/fuzz.sh says how a run that found nothing but met Go 1.26's
# deadline race is told from a finding).
FUZZTIME ?= 20s

fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) ./tools/fuzz.sh

bench: image
	bin/ephemeral bench -n 10
	bin/ephemeral bench density -n 60

clean:
	rm -rf bin
