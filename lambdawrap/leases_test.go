package lambdawrap_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/lambdawrap"
	"github.com/sluicehq/sluice/limiter"
)

func TestFormatParseLeases(t *testing.T) {
	in := []lambdawrap.NamedLease{
		{Limit: "per-key.concurrency", Lease: limiter.Lease{Key: "per-key:#abc", ID: "id1"}},
		{Limit: "fleet-us-east-1", Lease: limiter.Lease{Key: "fleet", ID: "id_2"}},
		{Limit: "nothing-held"},
	}
	s := lambdawrap.FormatLeases(in)
	if strings.Contains(s, "nothing-held") {
		t.Errorf("a lease that holds nothing was encoded: %q", s)
	}
	out, err := lambdawrap.ParseLeases(s)
	if err != nil {
		t.Fatalf("ParseLeases(%q): %v", s, err)
	}
	if len(out) != 2 || out[0] != in[0] || out[1] != in[1] {
		t.Errorf("round trip: %+v, want %+v", out, in[:2])
	}
	// A bare lease (limiter.Lease.String) still parses, without a limit.
	out, err = lambdawrap.ParseLeases(limiter.Lease{Key: "k", ID: "x"}.String())
	if err != nil || len(out) != 1 || out[0].Limit != "" || out[0].Lease.ID != "x" {
		t.Errorf("bare lease: %+v, %v", out, err)
	}
	for _, bad := range []string{"a@", "a@b", "@.", strings.Repeat("a@x.eA,", 17), "a@x.!!"} {
		if _, err := lambdawrap.ParseLeases(bad); !errors.Is(err, lambdawrap.ErrBadLeases) {
			t.Errorf("ParseLeases(%.40q) = %v, want ErrBadLeases", bad, err)
		}
	}
	if got := lambdawrap.LeasesFromContext(map[string]any{lambdawrap.LeaseContextKey: 42}); got != nil {
		t.Errorf("a number in the context: %+v", got)
	}
}

// TestReleaseLeases: the integration's wrapper frees every lease the
// authorizer took, whether the handler returns, errs or panics; an event
// without leases or with malformed ones just runs the handler.
func TestReleaseLeases(t *testing.T) {
	store, err := memory.NewLeases(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	perKey, _ := limiter.NewConcurrency(store, limiter.ConcurrencyConfig{Name: "per-key.concurrency", Capacity: 1, LeaseTTL: time.Hour})
	fleet, _ := limiter.NewConcurrency(store, limiter.ConcurrencyConfig{Name: "fleet", Capacity: 1, LeaseTTL: time.Hour})
	acquire := func() map[string]any {
		t.Helper()
		l1, d1, err1 := perKey.Acquire(ctx, "k", t0)
		l2, d2, err2 := fleet.Acquire(ctx, "fleet", t0)
		if err1 != nil || err2 != nil || !d1.Allowed || !d2.Allowed {
			t.Fatalf("acquire: %v %v %v %v (a lease was not released)", d1.Allowed, d2.Allowed, err1, err2)
		}
		return map[string]any{lambdawrap.LeaseContextKey: lambdawrap.FormatLeases([]lambdawrap.NamedLease{
			{Limit: "per-key.concurrency", Lease: l1}, {Limit: "fleet", Lease: l2}})}
	}
	var released []error
	r := lambdawrap.NewStoreReleaser(store)
	of := func(req events.APIGatewayProxyRequest) map[string]any { return req.RequestContext.Authorizer }
	mode := ""
	h := lambdawrap.ReleaseLeases(func(_ context.Context, req events.APIGatewayProxyRequest) (string, error) {
		// While the handler runs, both slots are taken.
		if _, d, _ := perKey.Acquire(ctx, "k", t0); d.Allowed {
			t.Error("the per-key slot is free during the handler")
		}
		switch mode {
		case "error":
			return "", errors.New("backend failed")
		case "panic":
			panic("backend crashed")
		}
		return "ok", nil
	}, r, of, lambdawrap.ReleaseConfig{OnError: func(_ context.Context, err error) { released = append(released, err) }})
	for _, m := range []string{"", "error", "panic"} {
		mode = m
		req := events.APIGatewayProxyRequest{}
		req.RequestContext.Authorizer = acquire()
		func() {
			defer func() { recover() }()
			h(ctx, req) //nolint:errcheck
		}()
	}
	// Every slot is free again (acquire would have failed otherwise).
	acquire()
	if len(released) != 0 {
		t.Errorf("release errors: %v", released)
	}
	// No leases, or malformed ones: the handler runs.
	mode = ""
	for _, a := range []map[string]any{nil, {lambdawrap.LeaseContextKey: "garbage"}} {
		req := events.APIGatewayProxyRequest{}
		req.RequestContext.Authorizer = a
		fleet.Release(ctx, limiter.Lease{}) //nolint:errcheck
		if _, err := lambdawrap.ReleaseLeases(func(context.Context, events.APIGatewayProxyRequest) (string, error) { return "ran", nil }, r, of, lambdawrap.ReleaseConfig{})(ctx, req); err != nil {
			t.Errorf("no leases: %v", err)
		}
	}
	// A lease without a limit name cannot be released by name.
	if err := r.ReleaseNamed(ctx, lambdawrap.NamedLease{Lease: limiter.Lease{ID: "x", Key: "k"}}); !errors.Is(err, lambdawrap.ErrBadLeases) {
		t.Errorf("nameless lease: %v", err)
	}
}
