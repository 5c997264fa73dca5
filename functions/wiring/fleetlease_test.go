package wiring

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/functions/dev/golden"
	"github.com/sluicehq/sluice/lambdawrap"
)

// TestFleetLeaseReleased: the fleet shedder's lease travels in the
// authorizer context and the integration's release frees the slot at once
// (the exact acquire-and-release variant), on a frozen clock where a lease
// would otherwise never lapse; a request the rules deny gives its fleet
// lease back itself.
func TestFleetLeaseReleased(t *testing.T) {
	clock := newFakeClock(golden.Clock)
	store := memLeases(t)
	b, _, _ := buildShed(t, map[string]string{
		"SLUICE_RULES_YAML": shedRules + `
  - name: tight
    match: {paths: ["/tight"]}
    key: "{ip}"
    limits: [{algorithm: fixed_window, limit: 1, window: 1m}]
`,
		"SLUICE_SHED_FLEET_CAPACITY": "2",
		"SLUICE_SHED_FLEET_RESERVE":  "0.5", // one non-critical slot
		"SLUICE_SHED_FLEET_NAME":     "orders-fleet",
		"SLUICE_SHED_LEASE_TTL":      "1m",
	}, store, clock)
	releaser := lambdawrap.NewStoreReleaser(store)
	shed := func(path string) bool {
		_, err := b.Handler.Handle(t.Context(), request(path, "192.0.2.1"))
		var se *authz.ShedError
		return errors.As(err, &se)
	}
	for i := range 5 {
		resp, _, err := b.Handler.Decide(t.Context(), request("/api/a", "192.0.2.1"))
		if err != nil || !resp.Allowed() {
			t.Fatalf("round %d: %v %+v", i, err, resp)
		}
		leases := lambdawrap.LeasesFromContext(map[string]any{lambdawrap.LeaseContextKey: resp.AuthContext().Leases})
		if len(leases) != 1 || leases[0].Limit != "orders-fleet" {
			t.Fatalf("round %d: leases in the context %+v", i, leases)
		}
		if !shed("/api/b") {
			t.Fatalf("round %d: the one non-critical slot is held, yet the next request was not shed", i)
		}
		if err := releaser.ReleaseNamed(t.Context(), leases[0]); err != nil {
			t.Fatal(err)
		}
	}
	// /tight allows once: the second is denied by its rule, and its fleet
	// lease is given back by the authorizer (no integration runs).
	if resp, _, err := b.Handler.Decide(t.Context(), request("/tight", "192.0.2.1")); err != nil || !resp.Allowed() {
		t.Fatalf("first /tight: %v", err)
	} else {
		releaser.ReleaseNamed(t.Context(), lambdawrap.LeasesFromContext(map[string]any{lambdawrap.LeaseContextKey: resp.AuthContext().Leases})[0]) //nolint:errcheck
	}
	resp, _, err := b.Handler.Decide(t.Context(), request("/tight", "192.0.2.1"))
	if err != nil || resp.Allowed() || resp.AuthContext().Leases != "" {
		t.Fatalf("second /tight: %v %+v, want a denial without leases", err, resp.AuthContext())
	}
	if shed("/api/a") {
		t.Error("a denied request kept its fleet slot")
	}
}
