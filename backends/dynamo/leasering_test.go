package dynamo_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/backends/memory"
	"github.com/sluicehq/sluice/limiter"
)

// TestLeaseRingMatchesMemory: the same calls, one at a time, through 4
// leasing buckets on DynamoDB and 4 on the memory store (which keeps
// storage.BucketState as it is): DynamoDB's lease ring, with its
// unsettled consumption and settlements, admits no more than the memory
// store's exact bucket, and less by at most what it counts early (a
// quarter of the bucket unsettled, and the settlement's skew allowance of
// refill). A ring that counted a lease's units twice admitted 2,051 of
// the memory store's 4,485 here.
func TestLeaseRingMatchesMemory(t *testing.T) {
	st, _, _ := newStore(t, dynamo.Config{})
	mem, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := limiter.TokenBucketConfig{Name: "ring", MaxAmount: 500, RefillTime: time.Millisecond, RefillAmount: 1, Leases: true}
	var procs [2][4]*limiter.TokenBucket
	for i := range 4 {
		if procs[0][i], err = limiter.NewTokenBucket(st, cfg); err != nil {
			t.Fatal(err)
		}
		if procs[1][i], err = limiter.NewTokenBucket(mem, cfg); err != nil {
			t.Fatal(err)
		}
	}
	key := "ring-" + t.Name()
	at := time.Now()
	var admitted [2]int64
	for n := range 8000 {
		stamp := at.Add(time.Duration(n) * 500 * time.Microsecond) // 2,000 a second offered, 1,000 refilled
		for k := range 2 {
			d, err := procs[k][n%4].AllowN(t.Context(), key, stamp, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted[k]++
			}
		}
	}
	slack := cfg.MaxAmount/4 + 50 // settleAt, and settleSkew's 50 ms of refill
	t.Logf("8,000 calls: DynamoDB admitted %d, memory %d (allowed difference %d)", admitted[0], admitted[1], slack)
	if admitted[0] > admitted[1] || admitted[1]-admitted[0] > slack {
		t.Errorf("DynamoDB admitted %d, memory %d: want at most, and within %d", admitted[0], admitted[1], slack)
	}
}
