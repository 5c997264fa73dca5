package limiter

import (
	"testing"
	"testing/synctest"
	"time"
)

// A give-back may be sent without waiting (memcached's noreply decr) and
// land after forget: a denial read meanwhile may count the take it gives
// back, so none is remembered for givebackLands after it. The test fails
// without the mark: the stale denial would be answered from the cache.
func TestDenyCacheGivebackMark(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := makeDenyCache(64)
		d := Decision{Limit: 30, Name: "w", RetryAfter: time.Hour, ResetAfter: time.Hour}
		t0 := time.Now().UnixNano()

		c.remember("k", t0, 1, d, c.generation())
		if _, ok := c.denied("k", t0+1, 1); !ok {
			t.Fatal("a denial with no give-back in sight was not remembered")
		}

		c.forget("k") // a take of "k" given back, sent without waiting
		if _, ok := c.denied("k", t0+2, 1); ok {
			t.Fatal("forget kept the denial")
		}
		// A decision that started after forget (its generation is the
		// current one) and read the store before the give-back landed.
		c.remember("k", t0+3, 1, d, c.generation())
		if _, ok := c.denied("k", t0+4, 1); ok {
			t.Fatal("a denial decided within givebackLands of a give-back was remembered")
		}
		// Other keys are not affected.
		c.remember("other", t0+3, 1, d, c.generation())
		if _, ok := c.denied("other", t0+4, 1); !ok {
			t.Fatal("a give-back of k stopped the cache for another key")
		}

		time.Sleep(givebackLands)
		now := time.Now().UnixNano()
		c.remember("k", now, 1, d, c.generation())
		if _, ok := c.denied("k", now+1, 1); !ok {
			t.Fatal("no denial remembered once the give-back had time to land")
		}
	})
}

// The marks are bounded like denials: a full shard evicts.
func TestDenyCacheMarksBounded(t *testing.T) {
	c := makeDenyCache(denyShards) // one entry per shard
	for i := range 1000 {
		c.forget(string(rune('a'+i%26)) + string(rune(i)))
	}
	if n := c.Len(); n > denyShards {
		t.Fatalf("%d entries held, want at most %d", n, denyShards)
	}
}
