package regions

import (
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// publish writes region r's item of key under kc as an agent would: the
// role taken, the ledger entry st and the board b saved.
func publish(t *testing.T, kc KeysConfig, key string, r int, st State, b board) {
	t.Helper()
	tt := kc.Table.withDefaults()
	tt.Name, tt.Region = kc.ItemPrefix()+key, r
	now := time.Now().UnixNano()
	it, err := tt.acquire(t.Context(), 0, "test", now, now+int64(time.Hour), tableItem{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := tt.save(t.Context(), it.epoch, st, b, now+int64(time.Hour)); err != nil {
		t.Fatal(err)
	}
}

// TestInspectShare: KeysConfig.Inspect reads a region's share of a key
// as its processes decide by it and writes nothing. Region 1 of three
// (30 units a 10 s window, 10 sub-windows: a base of 10 each) publishes
// a cap of 7, lowered to 4 (3 withheld) from a stamp on; its process
// decides 3, 2 and 1 units in sub-windows 0, 2 and 4. Under the cap of
// 7, one unit is left; under 4, none, and the wait is the process's own
// denial's: until sub-window 0's units leave the view. A bucket share's
// item in force is read likewise, against the process's decisions. The
// ledger shares are the bases less what each gave plus what it got.
func TestInspectShare(t *testing.T) {
	client, table := testTable(t)
	ctx := t.Context()
	st := memStore(t)
	kc := KeysConfig{Config: Config{Regions: 3, Limit: 30, Window: 10 * time.Second, SubWindows: 10},
		Table: Table{Client: client, Table: table, Region: 1}, Prefix: "lim:", Store: st}
	const sub = time.Second
	// Stamps ahead of the real clock (a decision's requests end by its
	// stamp plus the deadline), on a sub-window boundary: 30 s, so that a
	// loaded machine's setup (the table, the publications) does not reach
	// them.
	base := time.Now().Truncate(sub).Add(30 * sub)
	lower := base.Add(5 * sub)
	// Region 1 gave 2 to region 2; region 0 gave 1 to region 1.
	publish(t, kc, "k", 1, State{Given: []int64{0, 0, 2}, Seq: 1}, board{
		Entry: Entry{Seq: 1, Until: base.Add(time.Hour).UnixNano(), Caps: []CapStep{{At: minStamp, Cap: 7}, {At: lower.UnixNano(), Cap: 4}}},
		Lows:  []lowering{{Units: 3, From: lower.UnixNano(), Ready: lower.Add(time.Second).UnixNano()}},
	})
	publish(t, kc, "k", 0, State{Given: []int64{0, 1, 0}, Seq: 1}, board{})

	k := kc.ItemPrefix() + "k" // the items' names: the prefix, the parameters' tag, the key
	lc, tt := kc.Config, kc.Table
	lc.Key, tt.Name = k, k
	p, err := NewProcess(lc, tt, st)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		at time.Duration
		n  int64
	}{{100 * time.Millisecond, 3}, {2500 * time.Millisecond, 2}, {4200 * time.Millisecond, 1}} {
		if got, err := p.AllowN(ctx, k, base.Add(d.at), d.n); err != nil || !got.Allowed {
			t.Fatalf("decision of %d at +%v: %+v, %v", d.n, d.at, got, err)
		}
	}
	tbl := tt.withDefaults()
	tbl.Region = 1
	before, err := tbl.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inspect := func(at time.Time) ShareView {
		t.Helper()
		v, err := kc.Inspect(ctx, "k", at)
		if err != nil {
			t.Fatal(err)
		}
		if v.Item != "regions/"+k+"/1" || v.Counter != k+"@1" || !v.Published || v.Seq != 1 || v.Withheld != 3 || !reflect.DeepEqual(v.Ledger, []int64{9, 9, 12}) {
			t.Fatalf("inspect at %v: %+v; want item regions/%[3]s/1, counter %[3]s@1, entry 1, 3 withheld, ledger shares [9 9 12]", at, v, k)
		}
		return v
	}

	// Under the cap of 7: 6 counted, one left (the process's next
	// decision takes it and leaves none).
	at := base.Add(4500 * time.Millisecond)
	v := inspect(at)
	if want := []CapStep{{At: lower.UnixNano(), Cap: 4}}; !reflect.DeepEqual(v.Ahead, want) {
		t.Errorf("caps ahead %+v; want %+v", v.Ahead, want)
	}
	if v.Share != 7 || v.Decision.Limit != 7 || v.Decision.Remaining != 1 || !v.Decision.Allowed || !v.RetryKnown || v.Decision.RetryAfter != 0 {
		t.Fatalf("under the cap of 7: %+v; want share 7, 1 left, allowed", v)
	}
	// Full again when sub-window 4's unit leaves the view (at 15 s).
	if want := base.Add(15 * sub).Sub(at); v.Decision.ResetAfter != want {
		t.Errorf("reset after %v; want %v", v.Decision.ResetAfter, want)
	}

	// Under the cap of 4: none left; the wait is the one the process's
	// denial gives (sub-window 0's 3 units leave the view at 11 s).
	at = base.Add(5500 * time.Millisecond)
	v = inspect(at)
	if v.Share != 4 || v.Decision.Remaining != 0 || v.Decision.Allowed || !v.RetryKnown {
		t.Fatalf("under the cap of 4: %+v; want share 4, none left, denied", v)
	}
	if want := base.Add(11 * sub).Sub(at); v.Decision.RetryAfter != want {
		t.Errorf("retry after %v; want %v (sub-window 0's units out of view)", v.Decision.RetryAfter, want)
	}
	after, err := tbl.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("inspect wrote the region's item:\nbefore %+v\nafter  %+v", before, after)
	}
	d, err := p.AllowN(ctx, k, at, 1)
	if err != nil || d.Allowed || d.RetryAfter != v.Decision.RetryAfter || d.Limit != v.Decision.Limit {
		t.Fatalf("the process's decision at the same stamp: %+v, %v; inspect showed %+v", d, err, v.Decision)
	}

	// A bucket share: 33 a minute at three regions (10 each); region
	// 1's item of 10 units (1 a 6 s) in force.
	bc := kc
	bc.Config = Config{Regions: 3, Bucket: &limiter.TokenBucketConfig{MaxAmount: 33, RefillTime: time.Minute, RefillAmount: 30}}
	b := bc.ItemPrefix() + "b"
	item := b + "@1#t.1"
	publish(t, bc, "b", 1, State{Given: []int64{0, 0, 0}, Seq: 1}, board{
		Entry: Entry{Seq: 1, Until: base.Add(time.Hour).UnixNano(), Items: []ItemStep{{Key: item, From: minStamp, Share: 10}}},
	})
	blc, btt := bc.Config, bc.Table
	blc.Key, btt.Name = b, b
	bp, err := NewProcess(blc, btt, st)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := bp.AllowN(ctx, b, base, 4); err != nil || !d.Allowed {
		t.Fatalf("bucket decision of 4: %+v, %v", d, err)
	}
	for _, c := range []struct {
		at   time.Duration
		left int64
	}{{time.Second, 6}, {13 * time.Second, 8}} { // a token every 6 s
		v, err := bc.Inspect(ctx, "b", base.Add(c.at))
		if err != nil {
			t.Fatal(err)
		}
		if v.Share != 10 || v.Counter != item || v.Decision.Remaining != c.left || !v.Decision.Allowed || !v.RetryKnown || v.Withheld != 0 ||
			!reflect.DeepEqual(v.Ledger, []int64{10, 10, 10}) {
			t.Fatalf("bucket at +%v: %+v; want share 10 on %s, %d left, ledger [10 10 10]", c.at, v, item, c.left)
		}
	}
	at = base.Add(13 * time.Second)
	if d, err := bp.AllowN(ctx, b, at, 8); err != nil || !d.Allowed {
		t.Fatalf("bucket decision of 8: %+v, %v", d, err)
	}
	v, err = bc.Inspect(ctx, "b", at)
	if err != nil {
		t.Fatal(err)
	}
	d, err = bp.AllowN(ctx, b, at, 1)
	if err != nil || v.Decision.Remaining != 0 || v.Decision.Allowed || d.Allowed || d.RetryAfter != v.Decision.RetryAfter || v.Decision.RetryAfter <= 0 {
		t.Fatalf("bucket emptied: inspect %+v; the process's decision %+v, %v; want none left, the same wait", v, d, err)
	}

	// No entry: nothing in force, no wait told.
	v, err = kc.Inspect(ctx, "none", at)
	if err != nil || v.Published || v.Share != 0 || v.Decision.Allowed || v.RetryKnown {
		t.Fatalf("a key with no entry: %+v, %v; want none published, no share, no wait told", v, err)
	}
}
