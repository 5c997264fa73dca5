package dynamo_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// The TransactWriteItems design of one batch per request, as far as it can be measured
// without a store implementation (see docs/benchmarks.md for why there is
// none): a decision of k limits is one transaction of k Updates, each
// conditioned on the version of the item the process last saw (a condition
// expression has no arithmetic, so "the estimate stays within the limit"
// cannot be a condition: the process computes the new state from the item
// it remembers and the write is exact only if that item is unchanged). A
// key new to the process goes with attribute_not_exists(pk); a cancelled
// transaction returns the items that failed their condition
// (ReturnValuesOnConditionCheckFailure=ALL_OLD), which the process
// remembers before it tries again.

// txProc is one process's memory of the items (version, count) it saw.
type txProc struct {
	seen map[string][2]int64 // pk -> {version, count}
}

// txDecide takes 1 from each of pks in one transaction, retrying lost
// races; it returns the attempts made and the write units DynamoDB
// reported.
func (p *txProc) txDecide(ctx context.Context, c *dynamodb.Client, pks []string) (attempts int, wcu float64, err error) {
	for attempts = 1; attempts <= 64; attempts++ {
		in := &dynamodb.TransactWriteItemsInput{ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal}
		for _, pk := range pks {
			u := &types.Update{
				TableName:                           aws.String(tableName),
				Key:                                 item{"pk": str(pk)},
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
			if s, ok := p.seen[pk]; ok {
				u.UpdateExpression = aws.String("SET v = :v1, c = :c1")
				u.ConditionExpression = aws.String("v = :v0")
				u.ExpressionAttributeValues = item{":v0": n(strconv.FormatInt(s[0], 10)), ":v1": n(strconv.FormatInt(s[0]+1, 10)), ":c1": n(strconv.FormatInt(s[1]+1, 10))}
			} else {
				u.UpdateExpression = aws.String("SET v = :v1, c = :c1")
				u.ConditionExpression = aws.String("attribute_not_exists(pk)")
				u.ExpressionAttributeValues = item{":v1": n("1"), ":c1": n("1")}
			}
			in.TransactItems = append(in.TransactItems, types.TransactWriteItem{Update: u})
		}
		out, err := c.TransactWriteItems(ctx, in)
		if err == nil {
			for _, cc := range out.ConsumedCapacity {
				wcu += aws.ToFloat64(cc.CapacityUnits)
			}
			for _, pk := range pks {
				s := p.seen[pk]
				p.seen[pk] = [2]int64{s[0] + 1, s[1] + 1}
			}
			return attempts, wcu, nil
		}
		var tc *types.TransactionCanceledException
		if !errors.As(err, &tc) {
			return attempts, wcu, err
		}
		for i, r := range tc.CancellationReasons {
			if aws.ToString(r.Code) != "ConditionalCheckFailed" || i >= len(pks) {
				continue
			}
			v, _ := strconv.ParseInt(r.Item["v"].(*types.AttributeValueMemberN).Value, 10, 64)
			cnt, _ := strconv.ParseInt(r.Item["c"].(*types.AttributeValueMemberN).Value, 10, 64)
			p.seen[pks[i]] = [2]int64{v, cnt}
		}
		// TransactionConflict (another transaction on an item): try again.
	}
	return attempts, wcu, errors.New("transaction: 64 attempts lost")
}

// BenchmarkBatchTransact: the transaction design's cost. Uncontended: one
// decision of three limits as one TransactWriteItems, alternating with one
// raw UpdateItem (p50 of each and their ratio; write units per decision
// as DynamoDB Local reports them). Contended: 64 goroutines (64
// processes, each remembering its own items), each decision taking from
// one hot key shared by all and two keys of its own: decisions/s,
// attempts per decision and write units per decision, against the
// parallel design's three UpdateItems (the store's Do, a sliding window on
// the hot key) in the same run.
func BenchmarkBatchTransact(b *testing.B) {
	b.Run("Uncontended", func(b *testing.B) {
		_, _, client := newStore(b, dynamo.Config{})
		ctx := context.Background()
		p := &txProc{seen: map[string][2]int64{}}
		pks := []string{"tx/" + limitertest.Key(b), "tx/" + limitertest.Key(b), "tx/" + limitertest.Key(b)}
		rawKey := limitertest.Key(b)
		for range 20 {
			if _, _, err := p.txDecide(ctx, client, pks); err != nil {
				b.Fatal(err)
			}
		}
		var wcu float64
		tx, raw := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			_, w, err := p.txDecide(ctx, client, pks)
			if err != nil {
				b.Fatal(err)
			}
			wcu += w
			t1 := time.Now()
			if err := rawUpdate(ctx, client, rawKey); err != nil {
				b.Fatal(err)
			}
			tx, raw = append(tx, t1.Sub(t0)), append(raw, time.Since(t1))
		}
		b.StopTimer()
		reportP50(b, "tx", tx, raw)
		b.ReportMetric(wcu/float64(b.N), "wcu/decision")
	})
	b.Run("Contended", func(b *testing.B) {
		const workers = 64
		s, r, client := newStore(b, dynamo.Config{})
		r.consumed = true
		ctx := context.Background()
		hot := "tx/" + limitertest.Key(b)
		items := threeLimits(b, s)
		items[0].Key = limitertest.Key(b) // the window: one key for all
		var next atomic.Int64
		var attempts, errs atomic.Int64
		var wcuMilli atomic.Int64
		run := func(op func(w int) error) time.Duration {
			next.Store(0)
			var wg sync.WaitGroup
			t0 := time.Now()
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if err := op(w); err != nil {
							if errs.Add(1) == 1 {
								b.Logf("first error: %v", err)
							}
						}
					}
				}()
			}
			wg.Wait()
			return time.Since(t0)
		}
		procs := make([]*txProc, workers)
		own := make([][]string, workers)
		for w := range procs {
			procs[w] = &txProc{seen: map[string][2]int64{}}
			own[w] = []string{hot, "tx/" + limitertest.Key(b), "tx/" + limitertest.Key(b)}
		}
		b.ResetTimer()
		txTime := run(func(w int) error {
			a, wcu, err := procs[w].txDecide(ctx, client, own[w])
			attempts.Add(int64(a))
			wcuMilli.Add(int64(wcu * 1000))
			return err
		})
		txErrs := errs.Swap(0)
		r.total.Store(0)
		r.wcuMilli.Store(0)
		parTime := run(func(w int) error {
			its := append([]limiter.Item(nil), items...)
			its[1].Key, its[2].Key = own[w][1], own[w][2]
			out := make([]limiter.Outcome, len(its))
			// DynamoDB Local queues 192 requests for longer than the
			// store's default 1 s: the same bound as the transactions.
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := limiter.Decide(ctx, time.Now(), its, out)
			return err
		})
		b.StopTimer()
		txRate, parRate := float64(b.N)/txTime.Seconds(), float64(b.N)/parTime.Seconds()
		b.ReportMetric(txRate, "tx-decisions/s")
		b.ReportMetric(parRate, "parallel-decisions/s")
		b.ReportMetric(float64(attempts.Load())/float64(b.N), "tx-attempts/decision")
		b.ReportMetric(float64(wcuMilli.Load())/1000/float64(b.N), "tx-wcu/decision")
		b.ReportMetric(float64(r.total.Load())/float64(b.N), "parallel-requests/decision")
		b.ReportMetric(float64(r.wcuMilli.Load())/1000/float64(b.N), "parallel-wcu/decision")
		b.ReportMetric(float64(txErrs), "tx-failed")
		b.ReportMetric(float64(errs.Load()), "parallel-failed")
	})
}
