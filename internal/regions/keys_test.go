package regions

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// TestKeysOtherParameters: two Keys of one prefix whose limits differ (a
// rules reload that lowered a global limit from 200 to 20 units a minute
// keeps the old Keys beside the new one until the replaced policy
// retires) share no item and no wants index. Two regions on one table:
// region 0 decided key x on the old Keys (before the reload; none since),
// and sweeps both (as its keeper does while both are held); region 1, on the new
// limit only, decides x hot, runs out of its base share (10), and lists
// x as wanted. Region 1 must not admit more than 20 units in the
// window, and the regions' shares of x under the new limit, as their
// ledger entries show them, must each be within 0..20 and not sum above
// 20. Before, the old Keys read the same index and ticked its agent
// of x, of a limit of 200 (a base share of 100 here), on region 0's item
// of x, and gave region 1 units of the wrong limit. Region 0's new Keys
// reads region 1's listing (what a region on the same parameters lists,
// whichever Keys made it) and ticks x.
func TestKeysOtherParameters(t *testing.T) {
	client, table := testTable(t)
	ctx := t.Context()
	prefix := fmt.Sprintf("params-%d:", time.Now().UnixNano())
	win := func(limit int64) Config {
		return Config{Regions: 2, Limit: limit, Window: time.Minute, SubWindows: 6}
	}
	newKeys := func(cfg Config, r int, holder string, store any) *Keys {
		k, err := NewKeys(KeysConfig{Config: cfg, Table: Table{Client: client, Table: table, Region: r}, Prefix: prefix, Store: store, Holder: holder})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	s0 := memStore(t)
	old, cur := newKeys(win(200), 0, "r0-old", s0), newKeys(win(20), 0, "r0-new", s0)
	r1 := newKeys(win(20), 1, "r1", memStore(t))
	for range 2 {
		if _, err := old.AllowN(ctx, "x", time.Now(), 1); err != nil {
			t.Logf("region 0: %v", err)
		}
	}
	// Region 0 sweeps both Keys every 250 ms until stop is closed.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			now := time.Now()
			old.Sweep(ctx, now) //nolint:errcheck // counted in its stats
			cur.Sweep(ctx, now) //nolint:errcheck // counted in its stats
			select {
			case <-stop:
				return
			case <-time.After(time.Until(now.Add(250 * time.Millisecond))):
			}
		}
	})
	var (
		admitted, calls int64
		listedAt        time.Time
	)
	start := time.Now()
	for end := start.Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		d, err := r1.AllowN(ctx, "x", time.Now(), 1)
		calls++
		if err == nil && d.Allowed {
			admitted++
		}
		if st, _ := r1.Stats("x"); st.Wants.Listed && listedAt.IsZero() {
			listedAt = time.Now()
			end = listedAt.Add(5 * time.Second) // a grant takes about 3 s from a listing on one table
		}
	}
	close(stop)
	wg.Wait()
	so, sc := old.SweepStats(), cur.SweepStats()
	st, _ := r1.Stats("x")
	v, err := r1.cfg.Inspect(ctx, "x", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	bad := false
	for _, sh := range v.Ledger {
		sum += sh
		bad = bad || sh < 0 || sh > 20
	}
	t.Logf("region 1: %d admitted of %d calls in %v (listed x after %v); its agent %+v; shares of the limit of 20 by the ledger %v; region 0's sweeps: old Keys %+v, new %+v",
		admitted, calls, time.Since(start).Round(time.Millisecond), listedAt.Sub(start).Round(time.Millisecond), st.Agent, v.Ledger, so, sc)
	if listedAt.IsZero() {
		t.Fatal("region 1 never listed x")
	}
	if admitted > 20 || sum > 20 || bad {
		t.Errorf("region 1 admitted %d units; the ledger's shares %v (sum %d): a limit of 20", admitted, v.Ledger, sum)
	}
	if so.Wanted != 0 || sc.Wanted == 0 || sc.Ticks == 0 {
		t.Errorf("region 0's old Keys read %d keys wanted, its new one %d (ticks %d): want none, then x read and ticked", so.Wanted, sc.Wanted, sc.Ticks)
	}
}

// TestParamsTag: a Keys' items are named by the numbers its shares
// divide (the regions, a window's or a bucket's), the same in every
// region whatever else its configuration says (leases, skew, offers, the
// key), and by none of the rest.
func TestParamsTag(t *testing.T) {
	w := Config{Regions: 3, Limit: 60, Window: time.Minute, SubWindows: 6}
	b := Config{Regions: 3, Bucket: &limiter.TokenBucketConfig{Name: "b", MaxAmount: 60, RefillTime: time.Second, RefillAmount: 2}}
	same := func(c Config, f func(*Config)) Config {
		f(&c)
		if c.Bucket != nil {
			bc := *c.Bucket
			c.Bucket = &bc
		}
		return c
	}
	bucket := func(f func(*limiter.TokenBucketConfig)) Config {
		c := b
		bc := *b.Bucket
		f(&bc)
		c.Bucket = &bc
		return c
	}
	for _, c := range []struct {
		name  string
		a, b  Config
		equal bool
	}{
		{"window, other leases, skew, offers and key", w, same(w, func(c *Config) { c.Leases, c.Skew, c.Offers, c.Key = true, time.Second, true, "k" }), true},
		{"bucket, other name and leases", b, same(bucket(func(bc *limiter.TokenBucketConfig) { bc.Name, bc.Leases = "other", true }), func(c *Config) { c.Leases = true }), true},
		{"window limit", w, same(w, func(c *Config) { c.Limit = 61 }), false},
		{"window length", w, same(w, func(c *Config) { c.Window = time.Hour }), false},
		{"sub-windows", w, same(w, func(c *Config) { c.SubWindows = 12 }), false},
		{"regions", w, same(w, func(c *Config) { c.Regions = 2 }), false},
		{"bucket capacity", b, bucket(func(bc *limiter.TokenBucketConfig) { bc.MaxAmount = 61 }), false},
		{"bucket refill time", b, bucket(func(bc *limiter.TokenBucketConfig) { bc.RefillTime = time.Minute }), false},
		{"bucket refill amount", b, bucket(func(bc *limiter.TokenBucketConfig) { bc.RefillAmount = 3 }), false},
		{"a window and a bucket of the same numbers", Config{Regions: 3, Limit: 60}, Config{Regions: 3, Bucket: &limiter.TokenBucketConfig{MaxAmount: 60}}, false},
	} {
		ka, kb := KeysConfig{Config: c.a, Prefix: "gw:"}, KeysConfig{Config: c.b, Prefix: "gw:"}
		if got := ka.ItemPrefix() == kb.ItemPrefix(); got != c.equal || !strings.HasPrefix(ka.ItemPrefix(), "gw:") {
			t.Errorf("%s: item prefixes %q and %q; want equal %v", c.name, ka.ItemPrefix(), kb.ItemPrefix(), c.equal)
		}
	}
}

// namesTagFaults lists where ItemPrefix does not follow the regions'
// names in order: two regions that order SLUICE_REGIONS differently
// (a reordered list deployed one region at a time) each hold a place
// that names another region's items in the other's list, so they must
// share no item; the same names in one order must share them.
func namesTagFaults() []string {
	w := Config{Regions: 3, Limit: 60, Window: time.Minute, SubWindows: 6}
	kc := func(names ...string) KeysConfig { return KeysConfig{Config: w, Prefix: "gw:", Names: names} }
	var faults []string
	for _, c := range []struct {
		name  string
		a, b  KeysConfig
		equal bool
	}{
		{"the same order", kc("us-east-1", "eu-west-1", "ap-south-1"), kc("us-east-1", "eu-west-1", "ap-south-1"), true},
		{"two regions swapped", kc("us-east-1", "eu-west-1", "ap-south-1"), kc("eu-west-1", "us-east-1", "ap-south-1"), false},
		{"rotated", kc("us-east-1", "eu-west-1", "ap-south-1"), kc("eu-west-1", "ap-south-1", "us-east-1"), false},
		{"another region", kc("us-east-1", "eu-west-1", "ap-south-1"), kc("us-east-1", "eu-west-1", "sa-east-1"), false},
	} {
		if got := c.a.ItemPrefix() == c.b.ItemPrefix(); got != c.equal {
			faults = append(faults, fmt.Sprintf("%s: item prefixes %q and %q; want equal %v", c.name, c.a.ItemPrefix(), c.b.ItemPrefix(), c.equal))
		}
	}
	return faults
}

// TestNamesTag: the regions' order names other items, and Keys refuse
// names that do not count the regions.
func TestNamesTag(t *testing.T) {
	for _, f := range namesTagFaults() {
		t.Error(f)
	}
	cfg := KeysConfig{Config: Config{Regions: 3, Limit: 60, Window: time.Minute, SubWindows: 6}, Prefix: "gw:", Holder: "h",
		Names: []string{"us-east-1", "eu-west-1"}}
	if _, err := NewKeys(cfg); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "2 regions named") {
		t.Errorf("two names for three regions: %v; want %v naming the count", err, ErrInvalidConfig)
	}
}

// TestNamesTagFailsBroken: with the names left out of the tag, the
// orders share items, and namesTagFaults says so.
func TestNamesTagFailsBroken(t *testing.T) {
	brokenNamesTag = true
	defer func() { brokenNamesTag = false }()
	if f := namesTagFaults(); len(f) != 3 {
		t.Errorf("names left out of the tag: %d faults %q; want the 3 other orders and regions sharing items", len(f), f)
	}
}
