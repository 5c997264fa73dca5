package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/wiring"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/policy"
)

// globalRules has a rule with scope global (one limit across regions):
// 6 a minute, 2 a region before any grant at three regions.
const globalRules = `rules:
  - name: global-ip
    key: "{ip}"
    scope: global
    fail: closed
    limits:
      - {name: global-minute, algorithm: sliding_window, limit: 6, window: 1m, backend: dynamo}
`

var globalRegions = []string{"us-east-1", "eu-west-1", "ap-northeast-1"}

// globalAuthorizer is the authorizer built by the authorizer's own wiring
// from the environment the construct sets (table mode mode; for eventual,
// the regions and this one, region) on DynamoDB Local, without a deny
// cache (every request reaches the store); it returns the authorizer and
// the table.
func globalAuthorizer(t *testing.T, mode, region string) (*wiring.Built, string, string) {
	t.Helper()
	return globalAuthorizerWith(t, mode, region, globalRules, nil)
}

// globalAuthorizerWith is globalAuthorizer with rules and further
// variables.
func globalAuthorizerWith(t *testing.T, mode, region, rules string, extra map[string]string) (*wiring.Built, string, string) {
	t.Helper()
	endpoint := testserver.DynamoDB(t)
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_DYNAMODB": endpoint, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
		"AWS_SESSION_TOKEN": "", config.EnvAWSRegion: "us-east-1", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
		config.EnvTableMode: "", config.EnvRegions: "",
	} {
		t.Setenv(k, v)
	}
	table := fmt.Sprintf("sluice-cmd-global-%d", time.Now().UnixNano())
	vars := map[string]string{
		config.EnvDynamoTable: table, config.EnvDeadline: "5s", config.EnvRulesYAML: rules, config.EnvDenyCache: "false",
		config.EnvTableMode: mode,
	}
	maps.Copy(vars, extra)
	if mode == config.TableEventual {
		vars[config.EnvRegions], vars[config.EnvAWSRegion] = strings.Join(globalRegions, ","), region
	}
	env, err := wiring.ParseEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	b, err := wiring.Build(context.Background(), env, wiring.Outputs{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, CreateTable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, table, endpoint
}

// globalEvent is the events' HTTP API request from source IP ip.
func globalEvent(t *testing.T, ip string) []byte {
	t.Helper()
	event, err := os.ReadFile("../../events/http-request.json")
	if err != nil {
		t.Fatal(err)
	}
	return []byte(strings.ReplaceAll(string(event), "198.51.100.7", ip))
}

// exhaust decides requests from ip through b until one is denied and
// returns how many were admitted. A decision that failed (a loaded
// machine past the deadline: the rule's fail mode decided) is logged and
// not counted, a few times.
func exhaust(t *testing.T, b *wiring.Built, ip string) int {
	t.Helper()
	admitted, failed := 0, 0
	for range 20 {
		_, res, err := b.Handler.Decide(context.Background(), globalEvent(t, ip))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Evals) == 1 && res.Evals[0].Failed {
			if failed++; failed > 3 {
				t.Fatalf("%d decisions failed, the last: %v", failed, res.Evals[0].Err)
			}
			t.Logf("a decision failed (the fail mode decided): %v", res.Evals[0].Err)
			continue
		}
		if len(res.Evals) != 1 || res.Evals[0].Err != nil {
			t.Fatalf("decision: %+v", res)
		}
		if res.Outcome == policy.Deny {
			return admitted
		}
		admitted++
	}
	t.Fatalf("%d requests from %s admitted by a limit of 6", admitted, ip)
	return 0
}

// outcome is the authorizer's next decision for ip.
func outcome(t *testing.T, b *wiring.Built, ip string) policy.Outcome {
	t.Helper()
	_, res, err := b.Handler.Decide(context.Background(), globalEvent(t, ip))
	if err != nil {
		t.Fatal(err)
	}
	return res.Outcome
}

// TestGlobalEventual: a global rule on an eventual table is decided on
// the region's share, not on the plain key. After the authorizer's own
// wiring (region eu-west-1 of three, capacity leases on) admitted the
// region's share of a key and denies it, the plain key is still fresh
// (what the command showed before: full, allowed). inspect shows the
// region's share instead: the cap the region's entry holds at the
// command's clock (read from the item here), no more left than the cap
// less what was admitted, the item named; reset refuses and changes
// nothing. Neither writes: the table is the same item for item.
func TestGlobalEventual(t *testing.T) {
	b, table, endpoint := globalAuthorizer(t, config.TableEventual, "eu-west-1")
	ip := fmt.Sprintf("198.51.100.%d", time.Now().UnixNano()%250+1)
	admitted := exhaust(t, b, ip)
	if admitted < 1 || admitted > 2 {
		t.Fatalf("region eu-west-1 admitted %d before a denial; want 1 or 2 (its share of 6 at three regions is 2)", admitted)
	}
	before := settle(t, endpoint, table)
	item := "regions/" + minuteItems + "global-ip:" + ip + "/1"
	if !strings.Contains(before, item) {
		t.Fatalf("no item of region 1's share of the key in the table:\n%s", before)
	}
	store := []string{"-rule", "global-ip", "-key", ip, "-dynamo-table", table, "-dynamo-endpoint", endpoint}

	// What the plain key holds: the command as it read it before.
	plain := runJSON(t, env{now: time.Now}, append([]string{"inspect", "-table-mode", config.TableMRSC, "-rules", globalFile(t)}, store...)...)
	if len(plain.Limits) != 1 || plain.Limits[0].Remaining != 6 || !plain.Limits[0].Allowed {
		t.Fatalf("the plain key: %+v; want untouched (6 of 6) while the region denies", plain)
	}

	eventual := []string{"-table-mode", config.TableEventual, "-region", "eu-west-1", "-regions", strings.Join(globalRegions, ","), "-rules", globalFile(t)}
	now := time.Now()
	r := runShares(t, env{now: func() time.Time { return now }}, append(append([]string{"inspect"}, eventual...), store...)...)
	if r.Region != "eu-west-1" || r.Place != 1 || len(r.Shares) != 1 {
		t.Fatalf("inspect: %+v; want region eu-west-1, place 1, one limit", r)
	}
	sh := r.Shares[0]
	cp, _ := boardAt(t, endpoint, table, item, now)
	if sh.Name != "global-minute" || sh.Item != item || sh.Counter != minuteItems+"global-ip:"+ip+"@1" || sh.Capacity != 6 || sh.Share != cp ||
		sh.Remaining > max(cp-int64(admitted), 0) || !sh.Published {
		t.Fatalf("inspect: %+v; want the region's share of global-minute on %s: the cap in force %d, at most %d left (%d admitted)", sh, item, cp, max(cp-int64(admitted), 0), admitted)
	}
	if after := scan(t, endpoint, table); after != before {
		t.Fatalf("inspect changed the table:\nbefore %s\nafter  %s", before, after)
	}
	var out bytes.Buffer
	if err := runEnv(env{stdout: &out, stderr: &out, now: func() time.Time { return now }}, append(append([]string{"inspect"}, eventual...), store...)); err != nil {
		t.Fatal(err)
	}
	t.Logf("inspect printed:\n%s", out.String())
	for _, want := range []string{"region eu-west-1's share (place 1 of us-east-1,eu-west-1,ap-northeast-1)", "REGION-SHARE", "global-minute"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect printed:\n%s\nwant %q", out.String(), want)
		}
	}

	var errb bytes.Buffer
	out.Reset()
	args := append(append([]string{"reset", "-yes"}, eventual...), store...)
	err := runEnv(env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, now: time.Now}, args)
	var u usageError
	if !errors.Is(err, errShares) || errors.As(err, &u) {
		t.Fatalf("sluice %q: %v; want a refusal (errShares, not a usage error)", args, err)
	}
	if !strings.Contains(err.Error(), "region eu-west-1 (place 1 of us-east-1,eu-west-1,ap-northeast-1) decides it on its own items") ||
		!strings.Contains(err.Error(), "reset refused, nothing changed") || len(oneLine(err.Error())) > 600 {
		t.Errorf("reset: %v; want one line of at most 600 characters naming the region and its place, saying nothing changed", err)
	}
	if out.Len() > 0 {
		t.Errorf("sluice %q refused but printed %q", args, out.String())
	}
	if after := scan(t, endpoint, table); after != before {
		t.Fatalf("sluice %q changed the table:\nbefore %s\nafter  %s", args, before, after)
	}
}

// globalShareRules are a window and a bucket of a global rule each: 6 a
// minute (2 a region before any grant) and a bucket of 33 refilling 30 a
// minute (33 less one unit a region: 10 a region, a token every 6 s).
const globalShareRules = `rules:
  - name: global-ip
    key: "{ip}"
    scope: global
    fail: closed
    match: {paths: [/window]}
    limits:
      - {name: global-minute, algorithm: sliding_window, limit: 6, window: 1m, backend: dynamo}
  - name: global-tokens
    key: "{ip}"
    scope: global
    fail: closed
    match: {paths: [/tokens]}
    limits:
      - {name: global-bucket, algorithm: token_bucket, max_amount: 33, refill_time: 1m, refill_amount: 30, backend: dynamo}
`

// TestGlobalEventualShares: inspect shows the region's share and what is
// left of it as the decisions the authorizer's own wiring made (region
// eu-west-1 of three, leases off: every unit counted is one admitted)
// leave it, for a window and a bucket, and writes nothing. The share in
// force is read from the region's item here (its board's entry at the
// command's clock); what is left is computed from the decisions: the cap
// less the units admitted (a window: none leaves its view within the
// test), the bucket's share less them plus at most its refills since the
// first. Exhausted, a window's wait is until the unit that frees one has
// left the view: a window and a sub-window after the sub-window it was
// taken in, which lies between the first decision and the last.
func TestGlobalEventualShares(t *testing.T) {
	b, table, endpoint := globalAuthorizerWith(t, config.TableEventual, "eu-west-1", globalShareRules, map[string]string{config.EnvLeases: "false"})
	ip := fmt.Sprintf("198.51.100.%d", time.Now().UnixNano()%250+1)
	file := filepath.Join(t.TempDir(), "shares.yaml")
	if err := os.WriteFile(file, []byte(globalShareRules), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := []string{"-table-mode", config.TableEventual, "-region", "eu-west-1", "-regions", strings.Join(globalRegions, ","), "-rules", file,
		"-key", ip, "-dynamo-table", table, "-dynamo-endpoint", endpoint}
	decide := func(path string) bool {
		t.Helper()
		event := strings.ReplaceAll(string(globalEvent(t, ip)), "/pets/42", path)
		_, res, err := b.Handler.Decide(context.Background(), []byte(event))
		if err != nil || len(res.Evals) != 1 || res.Evals[0].Err != nil || res.Evals[0].Failed {
			t.Fatalf("decision of %s: %+v, %v", path, res, err)
		}
		return res.Outcome == policy.Allow
	}
	inspect := func(rule string) (shareResult, time.Time) {
		t.Helper()
		before := settle(t, endpoint, table)
		now := time.Now()
		r := runShares(t, env{now: func() time.Time { return now }}, append([]string{"inspect", "-rule", rule}, flags...)...)
		if after := scan(t, endpoint, table); after != before {
			t.Fatalf("inspect changed the table:\nbefore %s\nafter  %s", before, after)
		}
		if len(r.Shares) != 1 || r.Place != 1 || r.Region != "eu-west-1" || r.Key != rule+":"+ip || !r.Shares[0].Published {
			t.Fatalf("inspect %s: %+v; want region eu-west-1's share (place 1) of key %s:%s", rule, r, rule, ip)
		}
		return r, now
	}
	const (
		sub    = 3 * time.Second // a minute's 20 sub-windows
		window = time.Minute
	)

	// The window: one request, then until denied.
	item := "regions/" + minuteItems + "global-ip:" + ip + "/1"
	first := time.Now()
	if !decide("/window") {
		t.Fatal("the region's first request was denied")
	}
	r, now := inspect("global-ip")
	sh := r.Shares[0]
	cp, _ := boardAt(t, endpoint, table, item, now)
	if sh.Item != item || sh.Capacity != 6 || sh.Share != cp || sh.Remaining != max(cp-1, 0) || sh.Allowed != (cp-1 >= 1) || (cp >= 1) != (sh.RetryAfterMS != nil) {
		t.Fatalf("after one request: %+v; want the cap in force %d less the 1 admitted", sh, cp)
	}
	admitted := int64(1)
	for decide("/window") {
		if admitted++; admitted > 6 {
			t.Fatalf("%d admitted by a limit of 6", admitted)
		}
	}
	last := time.Now()
	r, now = inspect("global-ip")
	sh = r.Shares[0]
	cp, _ = boardAt(t, endpoint, table, item, now)
	t.Logf("window: %d admitted; inspect: %+v (retry after %v ms)", admitted, sh, ptr(sh.RetryAfterMS))
	if sh.Share != cp || sh.Remaining != max(cp-admitted, 0) || sh.Allowed != (cp-admitted >= 1) {
		t.Fatalf("after %d admitted: %+v; want the cap in force %d less them", admitted, sh, cp)
	}
	// In view until a window and a sub-window after its sub-window.
	out := func(at time.Time) int64 {
		return (at.UnixNano()/int64(sub)+1)*int64(sub) + int64(window) - now.UnixNano()
	}
	ms := func(d int64) int64 { return (d + int64(time.Millisecond) - 1) / int64(time.Millisecond) }
	if lo, hi := ms(out(first)), ms(out(last)); sh.ResetAfterMS < lo || sh.ResetAfterMS > hi {
		t.Errorf("reset after %d ms; want within [%d, %d] ms (the last unit out of view)", sh.ResetAfterMS, lo, hi)
	}
	switch {
	case cp < 1 && sh.RetryAfterMS != nil:
		t.Errorf("no share in force, yet a retry after %d ms", *sh.RetryAfterMS)
	case cp >= 1 && sh.Allowed && (sh.RetryAfterMS == nil || *sh.RetryAfterMS != 0):
		t.Errorf("allowed with a retry after %v", sh.RetryAfterMS)
	case cp >= 1 && !sh.Allowed:
		if lo, hi := ms(out(first)), ms(out(last)); sh.RetryAfterMS == nil || *sh.RetryAfterMS < lo || *sh.RetryAfterMS > hi {
			t.Errorf("retry after %v; want within [%d, %d] ms (a unit out of view)", sh.RetryAfterMS, lo, hi)
		}
	}

	// The bucket: 3 requests.
	item = "regions/" + bucketItems + "global-tokens:" + ip + "/1"
	first = time.Now()
	for i := range 3 {
		if !decide("/tokens") {
			t.Fatalf("bucket request %d denied", i)
		}
	}
	r, now = inspect("global-tokens")
	sh = r.Shares[0]
	_, share := boardAt(t, endpoint, table, item, now)
	t.Logf("bucket: 3 admitted; inspect: %+v", sh)
	refills := int64(now.Sub(first)/(6*time.Second)) + 1
	if share != 10 || sh.Share != share || sh.Capacity != 33 || sh.Remaining < share-3 || sh.Remaining > min(share, share-3+refills) ||
		!sh.Allowed || sh.RetryAfterMS == nil || *sh.RetryAfterMS != 0 || sh.Withheld != 0 || !slices.Equal(sh.Ledger, []int64{10, 10, 10}) ||
		!strings.HasPrefix(sh.Counter, bucketItems+"global-tokens:"+ip+"@1#") {
		t.Fatalf("bucket after 3 requests: %+v; want the item's share %d (10 at three regions) less the 3, plus at most %d refills, ledger [10 10 10]", sh, share, refills)
	}
}

// ptr is *p, or "-" for nil.
func ptr(p *int64) any {
	if p == nil {
		return "-"
	}
	return *p
}

// settle returns the table's items once two scans 100 ms apart agree (a
// denied request's add is given back without waiting).
func settle(t *testing.T, endpoint, table string) string {
	t.Helper()
	before := scan(t, endpoint, table)
	for i := 0; i < 50; i++ {
		time.Sleep(100 * time.Millisecond)
		again := scan(t, endpoint, table)
		if again == before {
			break
		}
		before = again
	}
	return before
}

// shareResult is inspect -json of a global rule on an eventual table.
type shareResult struct {
	Rule, Tier, Key string
	Region          string
	Place           int
	Shares          []struct {
		Name         string `json:"limit"`
		Capacity     int64  `json:"global_capacity"`
		Share        int64
		Remaining    int64
		ResetAfterMS int64  `json:"reset_after_ms"`
		RetryAfterMS *int64 `json:"retry_after_ms"`
		Allowed      bool
		Withheld     int64
		Published    bool
		Valid        bool `json:"entry_valid"`
		Item         string
		Counter      string
		Ledger       []int64 `json:"ledger_shares"`
	}
}

func runShares(t *testing.T, e env, args ...string) shareResult {
	t.Helper()
	var out, errb bytes.Buffer
	e.stdout, e.stderr = &out, &errb
	if err := runEnv(e, append(args, "-json")); err != nil {
		t.Fatalf("sluice %q: %v\n%s", args, err, errb.String())
	}
	var r shareResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("sluice %q printed %q: %v", args, out.String(), err)
	}
	return r
}

// boardAt reads the region's item name and returns, from its board's
// entry (internal/regions' layout, decoded here on its own), the window
// cap for a decision stamped now and the bucket share of the item in
// force then (0: none).
func boardAt(t *testing.T, endpoint, table, name string, now time.Time) (capAt, shareAt int64) {
	t.Helper()
	out, err := localClient(endpoint).GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: name}}})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := out.Item["b"].(*types.AttributeValueMemberS)
	if !ok {
		t.Fatalf("%s has no board: %v", name, out.Item)
	}
	var b struct {
		E struct {
			C []struct{ T, C int64 }
			I []struct {
				T, S int64
			}
		}
	}
	if err := json.Unmarshal([]byte(v.Value), &b); err != nil {
		t.Fatal(err)
	}
	at := now.UnixNano()
	for _, c := range b.E.C {
		if c.T <= at {
			capAt = c.C
		}
	}
	for _, i := range b.E.I {
		if i.T <= at {
			shareAt = i.S
		}
	}
	return capAt, shareAt
}

// scan is every item of table, as text in key order (the authorizer's
// agents tick only in line with its decisions: with none, nothing else
// writes).
func scan(t *testing.T, endpoint, table string) string {
	t.Helper()
	client := localClient(endpoint)
	var items []string
	p := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		out, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range out.Items {
			items = append(items, text(&types.AttributeValueMemberM{Value: it}))
		}
	}
	slices.Sort(items)
	return strings.Join(items, "\n")
}

func localClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint), Region: "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		}),
	})
}

// TestGlobalMRSC: on an MRSC table a global rule is one limit on the
// plain key, as a regional rule: inspect shows what the authorizer's own
// wiring (SLUICE_TABLE_MODE=mrsc) took, and reset gives it back.
func TestGlobalMRSC(t *testing.T) {
	b, table, endpoint := globalAuthorizer(t, config.TableMRSC, "")
	ip := fmt.Sprintf("198.51.100.%d", time.Now().UnixNano()%250+1)
	if n := exhaust(t, b, ip); n != 6 {
		t.Fatalf("admitted %d before a denial; want the limit, 6", n)
	}
	args := []string{"-table-mode", config.TableMRSC, "-rules", globalFile(t), "-rule", "global-ip", "-key", ip, "-dynamo-table", table, "-dynamo-endpoint", endpoint}
	r := runJSON(t, env{now: time.Now}, append([]string{"inspect"}, args...)...)
	if r.Key != "global-ip:"+ip || len(r.Limits) != 1 || r.Limits[0].Remaining != 0 || r.Limits[0].Allowed || r.Limits[0].RetryAfterMS <= 0 {
		t.Fatalf("inspect: %+v; want 0 of 6 left, denied with a retry-after", r)
	}
	r = runJSON(t, env{now: time.Now}, append([]string{"reset", "-yes"}, args...)...)
	if r.Limits[0].Remaining != 6 || !r.Limits[0].Allowed {
		t.Fatalf("after reset: %+v; want 6 of 6", r)
	}
	if got := outcome(t, b, ip); got != policy.Allow {
		t.Fatalf("after reset the authorizer decides %v; want allowed", got)
	}
}

// TestGlobalRegionErrors: with a global rule on an eventual table the
// region must be given and be one of the regions, checked as the
// authorizer checks its variables; nothing is read or printed. A
// regional rule, or another table mode, needs no region.
func TestGlobalRegionErrors(t *testing.T) {
	t.Setenv(config.EnvAWSRegion, "")
	t.Setenv(config.EnvRegions, "")
	t.Setenv(config.EnvTableMode, "")
	file := globalFile(t)
	base := []string{"inspect", "-rules", file, "-rule", "global-ip", "-key", "1.2.3.4", "-table-mode", config.TableEventual,
		"-dynamo-table", "t", "-dynamo-endpoint", "http://127.0.0.1:1"}
	all := strings.Join(globalRegions, ",")
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no region", []string{"-regions", all}, nil, "give the region whose share to read with -region NAME (default: " + config.EnvAWSRegion + ")"},
		{"empty region", []string{"-regions", all, "-region", " "}, map[string]string{config.EnvAWSRegion: "eu-west-1"}, "-region NAME"},
		{"not listed", []string{"-regions", all, "-region", "sa-east-1"}, nil, `-region (or ` + config.EnvAWSRegion + `): "sa-east-1" is not one of ` + config.EnvRegions},
		{"no regions", []string{"-region", "eu-west-1"}, nil, `-regions (or ` + config.EnvRegions + `): "": ` + config.EnvTableMode + `=eventual needs the deployment's regions, two or more`},
		{"one region", []string{"-region", "eu-west-1", "-regions", "eu-west-1"}, nil, "two or more"},
		{"twice", []string{"-region", "eu-west-1", "-regions", "eu-west-1,eu-west-1"}, nil, `-regions (or ` + config.EnvRegions + `): "eu-west-1" is listed twice`},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			args := append(append([]string{}, base...), c.args...)
			err := runEnv(env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, now: time.Now}, args)
			var u usageError
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &u) {
				t.Fatalf("sluice %q: %v; want a usage error containing %q", args, err, c.want)
			}
			if out.Len() > 0 {
				t.Errorf("printed %q", out.String())
			}
		})
	}
	// The defaults come from the authorizer's variables: the region
	// checks pass and inspect reads place 2's share (the closed endpoint
	// fails the read); reset refuses before any request.
	t.Setenv(config.EnvAWSRegion, "ap-northeast-1")
	t.Setenv(config.EnvRegions, all)
	var out, errb bytes.Buffer
	if err := runEnv(env{stdout: &out, stderr: &errb, now: time.Now}, append(append([]string{}, base...), "-timeout", "2s")); err == nil || errors.Is(err, errShares) ||
		!strings.Contains(err.Error(), "inspect global-ip/global-minute: region ap-northeast-1 (place 2 of us-east-1,eu-west-1,ap-northeast-1): ") {
		t.Fatalf("regions from the environment: %v; want the read of place 2's share to fail", err)
	}
	reset := append([]string{"reset", "-yes"}, base[1:]...)
	if err := runEnv(env{stdout: &out, stderr: &errb, now: time.Now}, reset); !errors.Is(err, errShares) || !strings.Contains(err.Error(), "place 2 of") {
		t.Fatalf("reset, regions from the environment: %v; want the refusal for place 2", err)
	}
	// Other table modes read the plain key: no region needed (the closed
	// endpoint fails the read).
	t.Setenv(config.EnvAWSRegion, "")
	for _, mode := range []string{config.TableRegional, config.TableMRSC} {
		args := append(append([]string{}, base...), "-table-mode", mode, "-timeout", "2s")
		err := runEnv(env{stdout: &out, stderr: &errb, now: time.Now}, args)
		if err == nil || errors.Is(err, errShares) || !strings.Contains(err.Error(), "inspect global-ip/global-minute on dynamo: ") {
			t.Errorf("-table-mode %q: %v; want the store's error (the plain key read)", mode, err)
		}
	}
}

// minuteItems and bucketItems begin the names of the items of the
// regional shares of global-minute and global-bucket at the three
// regions globalRegions: the limit's name and a tag of its parameters
// and the regions in order
// (regions.KeysConfig.ItemPrefix).
var (
	minuteItems = wiring.SharesKeys(&policy.Limit{Name: "global-minute", Algorithm: policy.SlidingWindow, Limit: 6, Window: time.Minute}, globalRegions, false).ItemPrefix()
	bucketItems = wiring.SharesKeys(&policy.Limit{Name: "global-bucket", Algorithm: policy.TokenBucket, MaxAmount: 33, RefillTime: time.Minute, RefillAmount: 30}, globalRegions, false).ItemPrefix()
)

func globalFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "global.yaml")
	if err := os.WriteFile(p, []byte(globalRules), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// text is v as text, a map's names in order.
func text(v types.AttributeValue) string {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return fmt.Sprintf("%q", v.Value)
	case *types.AttributeValueMemberN:
		return v.Value
	case *types.AttributeValueMemberBOOL:
		return fmt.Sprint(v.Value)
	case *types.AttributeValueMemberB:
		return fmt.Sprintf("%x", v.Value)
	case *types.AttributeValueMemberSS:
		return fmt.Sprint(slices.Sorted(slices.Values(v.Value)))
	case *types.AttributeValueMemberNS:
		return fmt.Sprint(slices.Sorted(slices.Values(v.Value)))
	case *types.AttributeValueMemberL:
		parts := make([]string, len(v.Value))
		for i, e := range v.Value {
			parts[i] = text(e)
		}
		return "[" + strings.Join(parts, " ") + "]"
	case *types.AttributeValueMemberM:
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(v.Value)) {
			parts = append(parts, k+":"+text(v.Value[k]))
		}
		return "{" + strings.Join(parts, " ") + "}"
	case *types.AttributeValueMemberNULL:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}
