package main

import (
	"bytes"
	"context"
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
		config.EnvDynamoTable: table, config.EnvDeadline: "5s", config.EnvRulesYAML: globalRules, config.EnvDenyCache: "false",
		config.EnvTableMode: mode,
	}
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
// wiring (region eu-west-1 of three) admitted the region's share of a key
// and denies it, the plain key is still fresh (what the command showed
// before: full, allowed), so inspect refuses, naming the region and its
// place, and prints nothing; reset refuses and changes nothing (the
// table is the same item for item).
func TestGlobalEventual(t *testing.T) {
	b, table, endpoint := globalAuthorizer(t, config.TableEventual, "eu-west-1")
	ip := fmt.Sprintf("198.51.100.%d", time.Now().UnixNano()%250+1)
	admitted := exhaust(t, b, ip)
	if admitted < 1 || admitted > 2 {
		t.Fatalf("region eu-west-1 admitted %d before a denial; want 1 or 2 (its share of 6 at three regions is 2)", admitted)
	}
	// The denied request's add is given back without waiting: scan until
	// two scans agree, so that it has landed.
	before := scan(t, endpoint, table)
	for i := 0; i < 50; i++ {
		time.Sleep(100 * time.Millisecond)
		again := scan(t, endpoint, table)
		if again == before {
			break
		}
		before = again
	}
	if !strings.Contains(before, "regions/global-minute:global-ip:"+ip+"/1") {
		t.Fatalf("no item of region 1's share of the key in the table:\n%s", before)
	}
	store := []string{"-rule", "global-ip", "-key", ip, "-dynamo-table", table, "-dynamo-endpoint", endpoint}

	// What the plain key holds: the command as it read it before.
	plain := runJSON(t, env{now: time.Now}, append([]string{"inspect", "-table-mode", config.TableMRSC, "-rules", globalFile(t)}, store...)...)
	if len(plain.Limits) != 1 || plain.Limits[0].Remaining != 6 || !plain.Limits[0].Allowed {
		t.Fatalf("the plain key: %+v; want untouched (6 of 6) while the region denies", plain)
	}

	for _, cmd := range [][]string{{"inspect"}, {"reset", "-yes"}} {
		var out, errb bytes.Buffer
		args := append(append(append([]string{}, cmd...), "-table-mode", config.TableEventual, "-region", "eu-west-1", "-regions", strings.Join(globalRegions, ","), "-rules", globalFile(t)), store...)
		err := runEnv(env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, now: time.Now}, args)
		var u usageError
		if !errors.Is(err, errShares) || errors.As(err, &u) {
			t.Fatalf("sluice %q: %v; want a refusal (errShares, not a usage error)", args, err)
		}
		if !strings.Contains(err.Error(), "region eu-west-1 (place 1 of us-east-1,eu-west-1,ap-northeast-1) decides it on its own items") {
			t.Errorf("sluice %q: %v; want the region and its place named", args, err)
		}
		if cmd[0] == "reset" && !strings.Contains(err.Error(), "reset refused, nothing changed") || len(oneLine(err.Error())) > 600 {
			t.Errorf("%s: %v; want one line of at most 600 characters (reset: saying nothing changed)", cmd[0], err)
		}
		if out.Len() > 0 {
			t.Errorf("sluice %q refused but printed %q", args, out.String())
		}
		if after := scan(t, endpoint, table); after != before {
			t.Fatalf("sluice %q changed the table:\nbefore %s\nafter  %s", args, before, after)
		}
	}
}

// scan is every item of table, as text in key order (the authorizer's
// agents tick only in line with its decisions: with none, nothing else
// writes).
func scan(t *testing.T, endpoint, table string) string {
	t.Helper()
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint), Region: "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		}),
	})
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
	// checks pass and the command refuses (before any request: the
	// endpoint is closed).
	t.Setenv(config.EnvAWSRegion, "ap-northeast-1")
	t.Setenv(config.EnvRegions, all)
	var out, errb bytes.Buffer
	if err := runEnv(env{stdout: &out, stderr: &errb, now: time.Now}, base); !errors.Is(err, errShares) || !strings.Contains(err.Error(), "place 2 of") {
		t.Fatalf("regions from the environment: %v; want the refusal for place 2", err)
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
