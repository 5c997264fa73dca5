package dynamo_test

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

type item = map[string]types.AttributeValue

func n(v string) types.AttributeValue   { return &types.AttributeValueMemberN{Value: v} }
func str(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func put(t *testing.T, c *dynamodb.Client, pk string, it item) {
	t.Helper()
	it = maps.Clone(it)
	it["pk"] = str(pk)
	if _, err := c.PutItem(testCtx(t), &dynamodb.PutItemInput{TableName: aws.String(tableName), Item: it}); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, c *dynamodb.Client, pk string) item {
	t.Helper()
	out, err := c.GetItem(testCtx(t), &dynamodb.GetItemInput{TableName: aws.String(tableName), Key: item{"pk": str(pk)}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// Bad items give an error wrapping ErrCorruptState that names the attribute,
// never a panic or a reset to a full bucket; the item is left as it was.
func TestCorruptItems(t *testing.T) {
	s, _, c := newStore(t, dynamo.Config{})
	b, _ := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 10, RefillTime: time.Hour})
	fw, _ := limiter.NewFixedWindow(s, limiter.FixedWindowConfig{Limit: 10, Window: time.Hour})
	sl, _ := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 10, Window: time.Hour})
	win := base.UnixNano() / int64(time.Hour)
	cur := dynamo.Attr("fw:10:1h0m0s", dynamo.SlotName(win))
	good := storage.AppendLog(nil, []int64{base.UnixNano()})
	tb := func(name string) string { return dynamo.Attr(b.Space(), name) }
	lg := func(name string) string { return dynamo.Attr("sl:10:1h0m0s", name) }
	cases := []struct {
		name string
		l    limiter.Limiter
		pk   func(key string) string
		it   item
		want string // in the error
	}{
		{"bucket tat missing", b, bucketPK(b), item{tb("b"): n("0")}, `"` + tb("t") + `": missing`},
		{"bucket tat a string", b, bucketPK(b), item{tb("t"): str("7"), tb("b"): n("0")}, `"` + tb("t") + `": want a Number, got a String`},
		{"bucket base missing", b, bucketPK(b), item{tb("t"): n("-3")}, `"` + tb("b") + `": missing`},
		{"bucket tat fractional", b, bucketPK(b), item{tb("t"): n("2.5"), tb("b"): n("0")}, `"` + tb("t") + `": not an int64`},
		{"window current counter a string", fw, spacePK("fw:10:1h0m0s"), item{cur: str("x")}, cur},
		{"window counter a list", fw, spacePK("fw:10:1h0m0s"), item{cur: &types.AttributeValueMemberL{}}, "want a Number, got a List"},
		{"window counter negative", fw, spacePK("fw:10:1h0m0s"), item{cur: n("-5")}, "want a count"},
		{"log a string", sl, spacePK("sl:10:1h0m0s"), item{lg("l"): str("x"), lg("v"): n("1")}, `"` + lg("l") + `": want a Binary, got a String`},
		{"log garbage", sl, spacePK("sl:10:1h0m0s"), item{lg("l"): &types.AttributeValueMemberB{Value: []byte{0xff}}, lg("v"): n("1")}, "sliding log header"},
		{"log version missing", sl, spacePK("sl:10:1h0m0s"), item{lg("l"): &types.AttributeValueMemberB{Value: good}}, `"` + lg("v") + `": missing`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, warm := range []bool{false, true} {
				key := limitertest.Key(t)
				pk := tc.pk(key)
				if warm { // the store remembers a good state first
					if _, err := tc.l.AllowN(testCtx(t), key, base, 1); err != nil {
						t.Fatal(err)
					}
				} else {
					s.ForgetCache()
				}
				put(t, c, pk, tc.it)
				before := get(t, c, pk)
				d, err := tc.l.AllowN(testCtx(t), key, base, 1)
				if !errors.Is(err, storage.ErrCorruptState) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("warm=%v: %+v, %v; want ErrCorruptState mentioning %q", warm, d, err, tc.want)
				}
				if tc.l != limiter.Limiter(fw) || !strings.Contains(tc.name, "current") {
					// Only a window's add of another counter may have
					// happened; the bad attribute is untouched.
					after := get(t, c, pk)
					for k, v := range before {
						if k != "ttl" && k != cur && !reflect.DeepEqual(after[k], v) {
							t.Fatalf("warm=%v: attribute %q changed from %v to %v", warm, k, v, after[k])
						}
					}
				}
				if _, err := tc.l.AllowN(testCtx(t), key, base, 1); !errors.Is(err, storage.ErrCorruptState) {
					t.Fatalf("second call: %v", err)
				}
			}
		})
	}
	// A Get (a read) on a bad bucket too.
	key := limitertest.Key(t)
	put(t, c, bucketPK(b)(key), item{tb("t"): str("1"), tb("b"): n("0")})
	if _, err := b.Get(testCtx(t), key, base); !errors.Is(err, storage.ErrCorruptState) {
		t.Fatalf("Get: %v", err)
	}
}

func bucketPK(b *limiter.TokenBucket) func(string) string {
	return spacePK(b.Space())
}

func spacePK(space string) func(string) string {
	return func(key string) string { return dynamo.ItemKey(storage.Key{Space: space, Name: key}) }
}

// A sliding log that would not fit in 1 KB is refused with a clear error,
// and what was stored stays valid.
func TestLogTooLarge(t *testing.T) {
	s, _, c := newStore(t, dynamo.Config{})
	l, _ := limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 1000, Window: 24 * time.Hour})
	key := limitertest.Key(t)
	pk := spacePK("sl:1000:24h0m0s")(key)
	var err error
	i := 0
	for ; i < 1000; i++ {
		// Entries a few seconds apart: about 5 bytes each.
		if _, err = l.Allow(testCtx(t), key, base.Add(time.Duration(i)*3*time.Second)); err != nil {
			break
		}
	}
	if !errors.Is(err, dynamo.ErrItemTooLarge) {
		t.Fatalf("after %d entries: %v, want ErrItemTooLarge", i, err)
	}
	t.Logf("refused entry %d: %v", i+1, err)
	if i < 100 {
		t.Fatalf("refused after only %d entries", i)
	}
	if size := itemSize(get(t, c, pk)); size > dynamo.ItemBudget {
		t.Fatalf("stored item is %d bytes", size)
	}
	s.ForgetCache()
	// Entries are kept a window past the newest (the horizon for late
	// clocks): two days later they are all gone.
	if d, err := l.Allow(testCtx(t), key, base.Add(49*time.Hour)); err != nil || !d.Allowed {
		t.Fatalf("two days later: %+v, %v", d, err)
	}
}

// itemSize approximates DynamoDB's item size: names plus values.
func itemSize(it item) int {
	size := 0
	for k, v := range it {
		size += len(k)
		switch v := v.(type) {
		case *types.AttributeValueMemberN:
			size += len(v.Value)/2 + 1
		case *types.AttributeValueMemberS:
			size += len(v.Value)
		case *types.AttributeValueMemberB:
			size += len(v.Value)
		}
	}
	return size
}

func counters(it item) int {
	c := 0
	for k := range it {
		if k != "pk" && k != "ttl" {
			c++
		}
	}
	return c
}

// A window item keeps only the sub-windows in view plus a few stale ones
// awaiting removal, under 1 KB, whatever the gaps in traffic and however
// many cold processes write it.
func TestWindowItemStaysSmall(t *testing.T) {
	s, r, c := newStore(t, dynamo.Config{})
	const k = 60
	w, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute, SubWindows: k})
	key := limitertest.Key(t)
	pk := spacePK(fmt.Sprintf("sw:%d:1m0s:%d", int64(1<<40), k))(key)
	at := base
	maxSize, maxCounters := 0, 0
	for i := range 400 {
		// Steady traffic, then gaps of 3 to 9 sub-windows, from a process
		// that forgot what it saw half of the time.
		if i > 100 {
			at = at.Add(time.Duration(3+i%7) * time.Second)
		} else {
			at = at.Add(time.Second)
		}
		if i%2 == 0 {
			s.ForgetCache()
		}
		if _, err := w.AllowN(testCtx(t), key, at, 1000+int64(i)); err != nil {
			t.Fatal(err)
		}
		it := get(t, c, pk)
		maxSize = max(maxSize, itemSize(it))
		maxCounters = max(maxCounters, counters(it))
	}
	t.Logf("largest item %d bytes, %d counters; %d requests for 400 adds, %d cleanups", maxSize, maxCounters, r.update.Load(), s.Stats().Cleanups)
	// The view and the horizon behind it (2(k+1) counters), plus stale
	// ones not yet removed; each counter's name is 7 bytes (the limit's
	// 2-byte prefix and 5), its count 3 here: at 60 sub-windows an item
	// may pass 1 KB (2 write units).
	if maxSize > dynamo.ItemBudget+256 || maxCounters > 2*(k+1)+8 {
		t.Fatalf("item grew to %d bytes and %d counters", maxSize, maxCounters)
	}
}

// The default window (20 sub-windows) with traffic in every sub-window and a
// writer one window late now and then: the item holds the view and the
// horizon, 2*21 counters, one write unit.
func TestWindowItemSizeDefault(t *testing.T) {
	s, r, c := newStore(t, dynamo.Config{})
	const k = limiter.DefaultSubWindows
	w, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute})
	key := limitertest.Key(t)
	pk := spacePK(fmt.Sprintf("sw:%d:1m0s:%d", int64(1<<40), k))(key)
	maxSize, maxCounters := 0, 0
	for i := range 3 * k {
		at := base.Add(time.Duration(i) * 3 * time.Second)
		if i%5 == 4 {
			at = at.Add(-time.Minute) // a writer a window late
		}
		if _, err := w.AllowN(testCtx(t), key, at, 100+int64(i)); err != nil {
			t.Fatal(err)
		}
		it := get(t, c, pk)
		maxSize = max(maxSize, itemSize(it))
		maxCounters = max(maxCounters, counters(it))
	}
	t.Logf("default window: largest item %d bytes with %d counters (key %d bytes); %d requests for %d adds", maxSize, maxCounters, len(pk), r.update.Load(), 3*k)
	if maxSize > dynamo.ItemBudget || maxCounters > 2*(k+1)+2 || maxCounters <= k+1 {
		t.Fatalf("item reached %d bytes and %d counters, want at most %d bytes and about %d counters", maxSize, maxCounters, dynamo.ItemBudget, 2*(k+1))
	}
	if got := r.update.Load(); got != 3*k {
		t.Fatalf("%d UpdateItems for %d adds within the horizon, want one each", got, 3*k)
	}
}

// A window's refund never takes a counter below zero.
func TestSubNeverNegative(t *testing.T) {
	s, _, c := newStore(t, dynamo.Config{})
	key := storage.Key{Space: "test-sub", Name: limitertest.Key(t)}
	ctx := testCtx(t)
	if _, err := s.Add(ctx, key, 7, 3, 2, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Sub(ctx, key, 7, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.Sub(ctx, key, 7, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Sub(ctx, key, 123, 1); err != nil { // never written
		t.Fatal(err)
	}
	if err := s.Sub(ctx, storage.Key{Space: "test-sub", Name: "absent"}, 7, 1); err != nil {
		t.Fatal(err)
	}
	it := get(t, c, dynamo.ItemKey(key))
	if v, ok := it[dynamo.Attr(key.Space, dynamo.SlotName(7))].(*types.AttributeValueMemberN); !ok || v.Value != "0" {
		t.Fatalf("counter after over-refund: %v, want 0", it)
	}
	if _, ok := it[dynamo.Attr(key.Space, dynamo.SlotName(123))]; ok {
		t.Fatal("Sub created a counter")
	}
	got, err := s.Add(ctx, key, 7, 3, 1, time.Hour)
	if err != nil || got.C[0] != 1 {
		t.Fatalf("add after refunds: %+v, %v", got, err)
	}
}

// Item keys are the key Names escaped injectively, kept short and valid
// UTF-8: every limit of one Name shares its item.
func TestItemKey(t *testing.T) {
	long := strings.Repeat("x", 10<<10)
	names := []string{"b/c", "c", "b%2Fc", "#x", "", "a", "\xff", "%FF", " ", "%20", "\x00", long, long + "y", "#/x", "%23"}
	seen := map[string]string{}
	for _, name := range names {
		pk := dynamo.ItemKey(storage.Key{Space: "a", Name: name})
		if other, dup := seen[pk]; dup {
			t.Fatalf("%q and %q share %q", other, name, pk)
		}
		seen[pk] = name
		if len(pk) > 160 || !utf8.ValidString(pk) || pk == "" {
			t.Fatalf("%q -> %q (%d bytes)", name, pk, len(pk))
		}
		if other := dynamo.ItemKey(storage.Key{Space: strings.Repeat("s", 200), Name: name}); other != pk {
			t.Fatalf("%q: spaces give items %q and %q, want one", name, pk, other)
		}
	}
	if got := dynamo.ItemKey(storage.Key{Space: "tb:5:1s:1", Name: "user 42/x"}); got != "#/user%2042%2Fx" {
		t.Fatalf("got %q", got)
	}
}

// CreateTable on an existing table is fine.
func TestCreateTableTwice(t *testing.T) {
	endpoint := sharedEndpoint(t)
	if err := dynamo.CreateTable(testCtx(t), newClient(endpoint), tableName); err != nil {
		t.Fatal(err)
	}
}

func TestNewValidates(t *testing.T) {
	c := newClient("http://127.0.0.1:1")
	for _, cfg := range []dynamo.Config{{}, {Table: "x", MaxAttempts: -1}, {Table: "x", BackoffBase: -1}} {
		if _, err := dynamo.New(c, cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	if _, err := dynamo.New(nil, dynamo.Config{Table: "x"}); err == nil {
		t.Error("New(nil client) accepted")
	}
}

// A writer whose clock is more than a window behind the others' has its add
// counted in the oldest sub-window of their view, so they see it: a late
// clock never frees what it took.
func TestWindowFarBehindClock(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	w, _ := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 5, Window: time.Minute, SubWindows: 6})
	key := limitertest.Key(t)
	now := base.Add(10 * time.Minute)
	ctx := testCtx(t)
	for i := range 4 {
		if d, err := w.Allow(ctx, key, now); err != nil || !d.Allowed {
			t.Fatalf("take %d: %+v, %v", i, d, err)
		}
	}
	// Ten minutes behind: sees the 4 as later traffic, takes the 5th.
	if d, err := w.Allow(ctx, key, base); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("late clock: %+v, %v; want allowed with 0 remaining", d, err)
	}
	if d, err := w.Allow(ctx, key, base); err != nil || d.Allowed {
		t.Fatalf("late clock again: %+v, %v; want denied", d, err)
	}
	// The punctual writer sees the late writer's unit.
	if d, err := w.Allow(ctx, key, now); err != nil || d.Allowed {
		t.Fatalf("punctual clock after the late take: %+v, %v; want denied", d, err)
	}
}
