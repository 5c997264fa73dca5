package wiring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/policy"
)

// A rule with scope global on a global table in the default (eventual)
// mode, through the authorizer as deployed: per region, authorizers
// built by Build from the environment the construct sets
// (SLUICE_TABLE_MODE=eventual, SLUICE_REGIONS, AWS_REGION), each a Lambda
// container deciding one request at a time, on the three-region harness
// (lag 1 s, last writer wins). Nothing but the table joins the regions and
// the containers: each key's agent runs in the containers, in line with
// their decisions (regions.Keys).

// sharesRegions are the harness's regions, in the deployment's order.
var sharesRegions = []string{"us-east-1", "eu-west-1", "ap-northeast-1"}

// The global limit of the runs: 200 per 2 s in four sub-windows (80 a
// second steadily), on the source IP (one key for every request).
const (
	sharesLimit  = 200
	sharesWindow = 2 * time.Second
	sharesRules  = `rules:
  - name: global-ip
    key: "{ip}"
    scope: global
    fail: closed
    limits:
      - {name: global-window, algorithm: sliding_window, limit: 200, window: 2s, sub_windows: 4, backend: dynamo}
`
	sharesProcs = 2 // containers per region
)

// sharesRate is the most decisions a second the window admits steadily.
const sharesRate = sharesLimit / float64(sharesWindow+sharesWindow/4) * float64(time.Second)

// stampClock is a container's clock that remembers the stamp it gave
// last: a container decides one request at a time, so it is the stamp of
// the decision just made.
type stampClock struct{ last atomic.Int64 }

func (c *stampClock) Now() time.Time {
	t := time.Now()
	c.last.Store(t.UnixNano())
	return t
}

// sharesContainer is one authorizer (a Lambda container) of a region.
type sharesContainer struct {
	region int
	built  *Built
	clock  *stampClock
	stdout *lockedBuffer // its EMF lines
}

// lockedBuffer is a container's stdout.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Take returns what was written since the last Take.
func (l *lockedBuffer) Take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	l.b.Reset()
	return s
}

// sdkSetenv points the SDK at endpoint with local credentials (the SDK's
// region stays us-east-1: DynamoDB Local keeps a database per region).
func sdkSetenv(t *testing.T, endpoint string) {
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_DYNAMODB": endpoint, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
		"AWS_SESSION_TOKEN": "", "AWS_REGION": "us-east-1", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
}

// longer is short, or long with SLUICE_LONG=1: the full length of a test
// whose longer run is a soak (docs/testing.md).
func longer[T any](short, long T) T {
	if os.Getenv("SLUICE_LONG") == "1" {
		return long
	}
	return short
}

// sharesEnv is region's environment as the construct sets it, with rules.
func sharesEnv(table, region, rules string) map[string]string {
	return map[string]string{
		config.EnvDynamoTable: table, config.EnvDeadline: "1s", config.EnvRulesYAML: rules,
		config.EnvTableMode: config.TableEventual, config.EnvRegions: strings.Join(sharesRegions, ","), config.EnvAWSRegion: region,
	}
}

// startShares starts the harness with a replicated table and builds
// sharesProcs authorizers per region on it.
func startShares(t *testing.T) []*sharesContainer {
	t.Helper()
	cs, _ := startSharesLag(t, time.Second)
	return cs
}

// sharesHarness is the package's three-region harness, started by the
// first test that needs it and stopped by TestMain: the tests on it
// each replicate a table of their own, at their own lag, and partition
// no region.
var sharesHarness = testserver.NewSharedRegions(testserver.RegionsConfig{})

// startSharesLag is startShares with replication lag lag (the table's:
// the harness is shared); it returns the harness too.
func startSharesLag(t *testing.T, lag time.Duration) ([]*sharesContainer, *testserver.Regions) {
	t.Helper()
	return startSharesRules(t, lag, sharesRules)
}

// startSharesRules is startSharesLag with the rules rules.
func startSharesRules(t *testing.T, lag time.Duration, rules string) ([]*sharesContainer, *testserver.Regions) {
	t.Helper()
	g := sharesHarness.Get(t)
	table := fmt.Sprintf("sluice-shares-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// The table in each region, and 50 writes to warm its new JVM (its
	// first requests are slow): every region at once.
	errs := make([]error, g.Len())
	var wg sync.WaitGroup
	for i := range g.Len() {
		c := dynamodb.New(dynamodb.Options{BaseEndpoint: aws.String(g.Endpoint(i)), Region: "us-east-1",
			Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
				return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
			})})
		wg.Go(func() { errs[i] = createWarm(ctx, c, table, 50) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := g.ReplicateLag(ctx, table, lag); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Unreplicate(table) }) // after the containers' Close
	var cs []*sharesContainer
	for i := range g.Len() {
		sdkSetenv(t, g.Endpoint(i))
		for range sharesProcs {
			raw := sharesEnv(table, sharesRegions[i], rules)
			env, err := ParseEnv(func(k string) string { return raw[k] })
			if err != nil {
				t.Fatal(err)
			}
			clock, stdout := &stampClock{}, &lockedBuffer{}
			b, err := Build(t.Context(), env, Outputs{Stdout: stdout, Stderr: discard{}, Clock: clock})
			if err != nil {
				t.Fatalf("region %s: %v", sharesRegions[i], err)
			}
			t.Cleanup(b.Close)
			cs = append(cs, &sharesContainer{region: i, built: b, clock: clock, stdout: stdout})
		}
	}
	return cs, g
}

// createWarm creates table with c and makes n writes to it.
func createWarm(ctx context.Context, c *dynamodb.Client, table string, n int) error {
	if err := dynamo.CreateTable(ctx, c, table); err != nil {
		return err
	}
	for j := range n {
		if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table),
			Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: fmt.Sprintf("warm-%d", j%3)}}}); err != nil {
			return err
		}
	}
	return nil
}

// sharesRun is what became of a run's decisions.
type sharesRun struct {
	calls                 []limitertest.Call
	admitted, failed      int64
	byRegion, failedIn    [3]int64
	admittedIn, offeredIn [2][3]int64 // by phase
	firstErr              string
	key                   string // the rule's rendered key
}

// logShares logs each container's counts of key.
func logShares(t *testing.T, cs []*sharesContainer, key string) {
	t.Helper()
	for _, c := range cs {
		for _, k := range c.built.shares {
			if st, ok := k.Stats(key); ok {
				t.Logf("region %d: holds %v, process %+v, agent %+v, table %+v", c.region, st.Holds, st.Process, st.Agent, st.Table)
			}
		}
	}
}

// inRegion is the calls region r's containers made (Worker's last digit).
func (r sharesRun) inRegion(region int) []limitertest.Call {
	var out []limitertest.Call
	for _, c := range r.calls {
		if c.Worker%10 == region {
			out = append(out, c)
		}
	}
	return out
}

// runShares offers event at rate decisions a second over the regions, split by
// each of phases in turn (phase i lasting ds[i]), every container deciding one
// request at a time at its share of its region's pace.
func runShares(t *testing.T, cs []*sharesContainer, event []byte, rate float64, ds []time.Duration, phases ...[]float64) sharesRun {
	t.Helper()
	var (
		mu  sync.Mutex
		run sharesRun
	)
	for ph, split := range phases {
		d := ds[ph]
		var wg sync.WaitGroup
		start := time.Now()
		for w, c := range cs {
			per := rate * split[c.region] / sharesProcs
			if per <= 0 {
				continue
			}
			every := time.Duration(float64(time.Second) / per)
			wg.Go(func() {
				paced(start, d, every, func() bool {
					t0 := time.Now()
					_, res, err := c.built.Handler.Decide(t.Context(), event)
					t1 := time.Now()
					if err != nil {
						t.Errorf("decide: %v", err)
						return false
					}
					stamp := time.Unix(0, c.clock.last.Load())
					allowed := res.Outcome == policy.Allow
					failed := len(res.Evals) > 0 && res.Evals[0].Failed
					mu.Lock()
					if len(res.Evals) > 0 {
						run.key = res.Evals[0].Key
					}
					run.calls = append(run.calls, limitertest.Call{Worker: w*10 + c.region, Key: "ip", Stamp: stamp, Cost: 1, Start: t0.Sub(start), End: t1.Sub(start),
						Reached: true, Allowed: allowed})
					run.offeredIn[ph][c.region]++
					if allowed {
						run.admitted++
						run.byRegion[c.region]++
						run.admittedIn[ph][c.region]++
					}
					if failed {
						run.failed++
						run.failedIn[c.region]++
						if run.firstErr == "" && res.Evals[0].Err != nil {
							run.firstErr = res.Evals[0].Err.Error()
						}
					}
					mu.Unlock()
					return true
				})
			})
		}
		wg.Wait()
	}
	return run
}

// exactShare is what one serialized window admits on the run's calls.
func exactShare(t *testing.T, run sharesRun) int64 {
	t.Helper()
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	exact, err := limiter.NewSlidingWindow(mem, limiter.SlidingWindowConfig{Name: "exact", Limit: sharesLimit, Window: sharesWindow, SubWindows: 4,
		Representation: limiter.SubWindowCounters})
	if err != nil {
		t.Fatal(err)
	}
	n, err := limitertest.ExactAdmitted(t.Context(), exact, run.calls)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSharesGlobalRule: a global rule (a bounded sliding window) on the
// eventual harness, through Build per container, two containers per
// region.
//
//   - moving: demand 98/1/1 for 5 s, then 1/1/98 for 5 s, at 1.5 times
//     the steady rate (about 240 offered in a window of 2 s, above the
//     limit of 200, so the check binds on an idle machine too: at 1.2
//     times, 192, it could fail only when load bunched the stamps):
//     never over the limit in any window of stamps over the union of
//     regions (limitertest.CheckTrailingWindow; brokenSharesSum fails
//     it), and units
//     given and received by the agents, which the containers alone run,
//     ticked by their decisions (a region with 1% of the demand ticks
//     about once a second).
//   - one region: demand in region 0 only, on another key: no agent runs
//     in regions 1 and 2, so they never give their base shares away, and
//     region 0 admits at most its own base share in any window (what
//     docs/regions.md states; the figure is logged against exact).
func TestSharesGlobalRule(t *testing.T) {
	cs := startShares(t)
	base := int64((sharesLimit + 2) / 3) // region 0's base share
	t.Run("moving", func(t *testing.T) {
		run := runShares(t, cs, sharesEvent(t, "198.51.100.7"), 1.5*sharesRate, []time.Duration{5 * time.Second, 5 * time.Second},
			[]float64{0.98, 0.01, 0.01}, []float64{0.01, 0.01, 0.98})
		exact := exactShare(t, run)
		t.Logf("%d decisions, %d admitted (by region %v; after the move %v of %v offered), exact %d: %.3f of exact; %d failed (by region %v) %s",
			len(run.calls), run.admitted, run.byRegion, run.admittedIn[1], run.offeredIn[1], exact, float64(run.admitted)/float64(max(exact, 1)),
			run.failed, run.failedIn, run.firstErr)
		for _, v := range limitertest.CheckTrailingWindow(run.calls, sharesLimit, sharesWindow) {
			t.Errorf("over the limit: %v", v)
		}
		// The check binds: more is offered in a window than the limit.
		offered, admitted := peakWindow(run.calls, false), peakWindow(run.calls, true)
		t.Logf("most in a window of %v: offered %d, admitted %d (limit %d)", sharesWindow, offered, admitted, sharesLimit)
		if offered <= sharesLimit {
			t.Errorf("at most %d offered in a window of %v: the over-the-limit check could not fail", offered, sharesWindow)
		}
		logShares(t, cs, run.key)
		// The shares moved, through agents run by the containers alone: a
		// grant given and one received. (How far they moved within the
		// run depends on the machine's load: logged, with each region's
		// windows above its base share.)
		var given, received int64
		for _, c := range cs {
			for _, k := range c.built.shares {
				if st, ok := k.Stats(run.key); ok {
					given, received = given+st.Agent.Given, received+st.Agent.Received
				}
			}
		}
		for _, r := range []int{0, 2} {
			t.Logf("region %d: %d windows above its base share %d", r, len(limitertest.CheckTrailingWindow(run.inRegion(r), base, sharesWindow)), base)
		}
		if given == 0 || received == 0 {
			t.Errorf("units given %d, received %d (over the containers' agents): the shares did not move", given, received)
		}
	})
	t.Run("one-region", func(t *testing.T) {
		// Another key: a different source IP, through the same containers.
		run := runShares(t, cs, sharesEvent(t, "203.0.113.9"), 1.2*sharesRate, []time.Duration{3 * time.Second}, []float64{1, 0, 0})
		exact := exactShare(t, run)
		t.Logf("%d decisions, %d admitted, exact %d: %.3f of exact; %d failed %s", len(run.calls), run.admitted, exact,
			float64(run.admitted)/float64(max(exact, 1)), run.failed, run.firstErr)
		for _, v := range limitertest.CheckTrailingWindow(run.calls, base, sharesWindow) {
			t.Errorf("region 0 alone over its base share %d: %v (regions without traffic gave theirs away?)", base, v)
		}
		if run.admitted == 0 {
			t.Errorf("nothing admitted")
		}
	})
}

// peakWindow is the most calls (admitted ones only, or all) with stamps
// in one window of sharesWindow.
func peakWindow(calls []limitertest.Call, admitted bool) int64 {
	cs := calls
	if !admitted {
		cs = make([]limitertest.Call, len(calls))
		for i, c := range calls {
			c.Allowed = true
			cs[i] = c
		}
	}
	var peak int64
	for _, v := range limitertest.CheckTrailingWindow(cs, 0, sharesWindow) {
		peak = max(peak, v.Units)
	}
	return peak
}

// sharesEvent is the events' HTTP API request from source IP ip (the
// rule's key).
func sharesEvent(t *testing.T, ip string) []byte {
	t.Helper()
	event, err := os.ReadFile("../../events/http-request.json")
	if err != nil {
		t.Fatal(err)
	}
	return []byte(strings.ReplaceAll(string(event), "198.51.100.7", ip))
}

// TestSharesConfigErrors: a deployment the shares cannot serve fails at
// start-up, naming what is wrong.
func TestSharesConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, region, regions, want string
	}{
		{"region not listed", "sa-east-1", "us-east-1,eu-west-1", `config: AWS_REGION: "sa-east-1" is not one of SLUICE_REGIONS`},
		{"no region", "", "us-east-1,eu-west-1", `config: AWS_REGION: "" is not one of SLUICE_REGIONS`},
		{"one region", "us-east-1", "us-east-1", "config: SLUICE_REGIONS: \"us-east-1\": SLUICE_TABLE_MODE=eventual needs the deployment's regions, two or more"},
		{"listed twice", "us-east-1", "us-east-1,eu-west-1,us-east-1", `config: SLUICE_REGIONS: "us-east-1" is listed twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := sharesEnv("t", tc.region, "")
			raw[config.EnvRegions] = tc.regions
			_, err := ParseEnv(func(k string) string { return raw[k] })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("fixed_window", func(t *testing.T) {
		sdkSetenv(t, testserver.DynamoDB(t))
		rules := strings.Replace(sharesRules, "{name: global-window, algorithm: sliding_window, limit: 200, window: 2s, sub_windows: 4,",
			"{name: global-window, algorithm: fixed_window, limit: 200, window: 2s,", 1)
		buildRefuses(t, rules, "a global fixed_window on an eventual table",
			`rule "global-ip" (rules[0]): scope: global-window is a fixed_window: regional shares (scope global on an eventual table) serve`)
	})
	t.Run("same name", func(t *testing.T) {
		// Two global rules naming their limits alike with other
		// parameters: their shares would tick each other's keys.
		sdkSetenv(t, testserver.DynamoDB(t))
		rules := sharesRules + strings.ReplaceAll(strings.ReplaceAll(sharesRules[len("rules:\n"):], "global-ip", "global-ip-2"), "limit: 200", "limit: 60")
		buildRefuses(t, rules, "two global limits of one name with other parameters",
			`rule "global-ip-2" (rules[1]): limits[0].name: "global-window" is also the name of limits[0] of the global rule "global-ip" (rules[0]), with limit 200 there and 60 here`)
	})
}

// buildRefuses builds the authorizer for rules on an eventual table of
// its own and fails t unless the build fails with an invalid rule whose
// message contains want (what names what was built).
func buildRefuses(t *testing.T, rules, what, want string) {
	t.Helper()
	raw := sharesEnv(fmt.Sprintf("sluice-shares-bad-%d", time.Now().UnixNano()), "eu-west-1", rules)
	env, err := ParseEnv(func(k string) string { return raw[k] })
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(t.Context(), env, Outputs{Stdout: discard{}, Stderr: discard{}})
	if err == nil {
		b.Close()
		t.Fatalf("built %s", what)
	}
	if !strings.Contains(err.Error(), want) || !errors.Is(err, policy.ErrInvalidRule) {
		t.Fatalf("got %v, want an invalid rule containing %q", err, want)
	}
}

// paced calls do every interval from start until d has passed since
// start, or until do returns false (a worker of the shares tests: one
// request at a time, as a container decides).
func paced(start time.Time, d, every time.Duration, do func() bool) {
	for k := 0; ; k++ {
		at := start.Add(time.Duration(k) * every)
		if at.Sub(start) >= d {
			return
		}
		time.Sleep(time.Until(at))
		if !do() {
			return
		}
	}
}
