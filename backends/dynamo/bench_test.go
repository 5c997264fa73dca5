package dynamo_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
)

// Benchmarks run against DynamoDB Local (scripts/testenv); the machine is
// shared, so they report ratios to a raw UpdateItem measured in the same run
// rather than absolute figures. See docs/benchmarks.md.

// rawUpdate is the baseline: one UpdateItem (ADD to a counter, no
// condition, no return values) on key.
func rawUpdate(ctx context.Context, c *dynamodb.Client, key string) error {
	return rawUpdateOn(ctx, c, tableName, key)
}

// rawUpdateOn is rawUpdate on table.
func rawUpdateOn(ctx context.Context, c *dynamodb.Client, table, key string) error {
	_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       item{"pk": str("raw/" + key)},
		UpdateExpression:          aws.String("ADD #c :one"),
		ExpressionAttributeNames:  map[string]string{"#c": "c"},
		ExpressionAttributeValues: item{":one": n("1")},
	})
	return err
}

// decider is one kind of decision, at the i-th step of a run.
type decider struct {
	name string
	make func(b *testing.B, s *dynamo.Store) func(ctx context.Context, key string, i int) error
}

var deciders = []decider{
	{"BucketAllow", func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
		tb := mustB(limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1 << 40, RefillTime: time.Hour}))(b)
		return func(ctx context.Context, key string, i int) error {
			d, err := tb.Allow(ctx, key, base)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied")
			}
			return err
		}
	}},
	{"BucketAllowColdCache", func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
		// A process that has not seen the (existing) key: the guess that it
		// is absent fails and returns the item, then the write.
		tb := mustB(limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1 << 40, RefillTime: time.Hour}))(b)
		return func(ctx context.Context, key string, i int) error {
			s.ForgetCache()
			_, err := tb.Allow(ctx, key, base)
			return err
		}
	}},
	{"BucketDeny", func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
		tb := mustB(limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1, RefillTime: time.Hour}))(b)
		return func(ctx context.Context, key string, i int) error {
			_, err := tb.Allow(ctx, key, base)
			return err
		}
	}},
	{"BucketRefill", func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
		// A refill is due at every decision: a write conditioned on the
		// exact old values.
		tb := mustB(limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 10, RefillTime: time.Millisecond}))(b)
		return func(ctx context.Context, key string, i int) error {
			_, err := tb.Allow(ctx, key, base.Add(time.Duration(i)*time.Millisecond))
			return err
		}
	}},
	{"SlidingWindow", func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
		w := mustB(limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 1 << 40, Window: time.Minute, SubWindows: 10}))(b)
		return func(ctx context.Context, key string, i int) error {
			_, err := w.Allow(ctx, key, base.Add(time.Duration(i)*10*time.Millisecond))
			return err
		}
	}},
	{"SlidingWindowPacked", packedDecider(1)},
	{"SlidingLog", func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
		l := mustB(limiter.NewSlidingLog(s, limiter.SlidingLogConfig{Limit: 50, Window: 100 * time.Millisecond}))(b)
		return func(ctx context.Context, key string, i int) error {
			_, err := l.Allow(ctx, key, base.Add(time.Duration(i)*time.Millisecond))
			return err
		}
	}},
}

// packedDecider is the packed representation at the default 160 slots,
// perSlot decisions per slot: after (2*160+1)*perSlot decisions a key's
// item is at its largest (steady traffic in every slot), about 1.6 KB.
// BenchmarkLatency takes one decision per slot; BenchmarkThroughput four,
// so that a goroutine stalled for a moment among 64 stays within the
// horizon (161 slots) of the others' stamps: its call would be Stale,
// denied (the stamps run far faster than time).
func packedDecider(perSlot int) func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
	return func(b *testing.B, s *dynamo.Store) func(context.Context, string, int) error {
		const slot = 100 * time.Millisecond
		w := mustB(limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: limiter.MaxPackedLimit, Window: limiter.DefaultSlots * slot, Representation: limiter.Packed, NoDenyCache: true}))(b)
		return func(ctx context.Context, key string, i int) error {
			d, err := w.Allow(ctx, key, base.Add(time.Duration(i)*slot/time.Duration(perSlot)))
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied")
			}
			return err
		}
	}
}

func mustB[T any](v T, err error) func(testing.TB) T {
	return func(tb testing.TB) T {
		if err != nil {
			tb.Fatal(err)
		}
		return v
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// BenchmarkLatency interleaves a raw UpdateItem and a decision on one warm
// key (sequentially), and reports both latency distributions, their ratios,
// and the requests and write capacity units per decision.
func BenchmarkLatency(b *testing.B) {
	for _, dc := range deciders {
		b.Run(dc.name, func(b *testing.B) {
			s, r, c := newStore(b, dynamo.Config{})
			r.consumed = true
			decide := dc.make(b, s)
			key := fmt.Sprintf("lat-%s-%d", dc.name, time.Now().UnixNano())
			ctx := context.Background()
			for i := range 20 { // warm up the key, the connection and the server
				if err := decide(ctx, key, i); err != nil {
					b.Fatal(err)
				}
				if err := rawUpdate(ctx, c, key); err != nil {
					b.Fatal(err)
				}
			}
			raw := make([]time.Duration, 0, b.N)
			dec := make([]time.Duration, 0, b.N)
			var reqs, wcu, rcu, lost int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := rawUpdate(ctx, c, key); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				r0, w0, rc0, l0 := r.load(), r.wcuMilli.Load(), r.rcuMilli.Load(), r.failed.Load()
				if err := decide(ctx, key, 20+i); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				reqs += r.load() - r0
				wcu += r.wcuMilli.Load() - w0
				rcu += r.rcuMilli.Load() - rc0
				lost += r.failed.Load() - l0
				raw = append(raw, t1.Sub(t0))
				dec = append(dec, t2.Sub(t1))
			}
			b.StopTimer()
			p50, p99 := percentile(dec, .5), percentile(dec, .99)
			r50, r99 := percentile(raw, .5), percentile(raw, .99)
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(r50.Microseconds())/1000, "raw-p50-ms")
			b.ReportMetric(float64(r99.Microseconds())/1000, "raw-p99-ms")
			b.ReportMetric(float64(p50)/float64(r50), "p50/raw")
			b.ReportMetric(float64(p99)/float64(r99), "p99/raw")
			b.ReportMetric(float64(reqs)/float64(b.N), "req/decision")
			// A failed conditional write consumes capacity too but reports
			// none: count it as one WCU (every item is under 1 KB).
			b.ReportMetric((float64(wcu)/1000+float64(lost))/float64(b.N), "WCU/decision")
			b.ReportMetric(float64(rcu)/1000/float64(b.N), "RCU/decision")
		})
	}
}

// parallel runs b.N calls of f over workers goroutines and returns the
// elapsed time and the number of failed calls.
func parallel(b *testing.B, workers int, f func(i int) error) (time.Duration, int64, error) {
	var next, failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := f(i); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	err, _ := first.Load().(error)
	return time.Since(start), failed.Load(), err
}

// BenchmarkThroughput measures decisions per second at 1, 16 and 64
// goroutines, on one hot key and spread over 10,000 keys, against raw
// UpdateItems on the same keys at the same concurrency in the same run.
func BenchmarkThroughput(b *testing.B) {
	for _, kind := range []string{"BucketAllow", "SlidingWindow", "SlidingWindowPacked"} {
		var dc decider
		for _, d := range deciders {
			if d.name == kind {
				dc = d
			}
		}
		if kind == "SlidingWindowPacked" {
			dc.make = packedDecider(4)
		}
		for _, keys := range []int{1, 10000} {
			for _, workers := range []int{1, 16, 64} {
				b.Run(fmt.Sprintf("%s/keys=%d/goroutines=%d", kind, keys, workers), func(b *testing.B) {
					s, r, c := newStore(b, dynamo.Config{})
					r.consumed = true
					decide := dc.make(b, s)
					prefix := fmt.Sprintf("tp-%d-", time.Now().UnixNano())
					keyOf := func(i int) string { return prefix + strconv.Itoa(i*7919%keys) }
					ctx := context.Background()
					b.ResetTimer()
					rawTime, rawFailed, err := parallel(b, workers, func(i int) error { return rawUpdate(ctx, c, keyOf(i)) })
					if rawFailed > 0 {
						b.Fatalf("%d raw updates failed: %v", rawFailed, err)
					}
					r0, w0, l0 := r.load(), r.wcuMilli.Load(), r.failed.Load()
					decTime, failed, err := parallel(b, workers, func(i int) error { return decide(ctx, keyOf(i), i) })
					b.StopTimer()
					if failed > 0 {
						b.Fatalf("%d decisions failed: %v", failed, err)
					}
					dps := float64(b.N) / decTime.Seconds()
					rps := float64(b.N) / rawTime.Seconds()
					b.ReportMetric(dps, "decisions/s")
					b.ReportMetric(rps, "raw-updates/s")
					b.ReportMetric(dps/rps, "ratio")
					b.ReportMetric(float64(r.load()-r0)/float64(b.N), "req/decision")
					// As in BenchmarkLatency, a failed condition counts one WCU.
					b.ReportMetric((float64(r.wcuMilli.Load()-w0)/1000+float64(r.failed.Load()-l0))/float64(b.N), "WCU/decision")
				})
			}
		}
	}
}

// BenchmarkContention compares the two bucket protocols on one hot key that
// every goroutine takes from (all takes fit): relative writes conditioned on
// a value range (the default) and writes conditioned on the exact old
// values only.
func BenchmarkContention(b *testing.B) {
	for _, mode := range []string{"relative", "exact-only"} {
		for _, workers := range []int{16, 64} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", mode, workers), func(b *testing.B) {
				s, r, _ := newStore(b, dynamo.Config{MaxAttempts: 1 << 20, Timeout: time.Minute, BackoffMax: 20 * time.Millisecond})
				dynamo.SetExactOnly(s, mode == "exact-only")
				tb := mustB(limiter.NewTokenBucket(s, limiter.TokenBucketConfig{MaxAmount: 1 << 40, RefillTime: time.Hour}))(b)
				key := fmt.Sprintf("cont-%d", time.Now().UnixNano())
				ctx := context.Background()
				if _, err := tb.Allow(ctx, key, base); err != nil { // create it
					b.Fatal(err)
				}
				r0, c0 := r.load(), s.Stats().Conflicts
				b.ResetTimer()
				el, failed, err := parallel(b, workers, func(int) error {
					d, err := tb.Allow(ctx, key, base)
					if err == nil && !d.Allowed {
						err = fmt.Errorf("denied")
					}
					return err
				})
				b.StopTimer()
				if failed > 0 {
					b.Fatalf("%d failed: %v", failed, err)
				}
				b.ReportMetric(float64(b.N)/el.Seconds(), "decisions/s")
				b.ReportMetric(float64(r.load()-r0)/float64(b.N), "req/decision")
				b.ReportMetric(float64(s.Stats().Conflicts-c0)/float64(b.N), "lost/decision")
			})
		}
	}
}
