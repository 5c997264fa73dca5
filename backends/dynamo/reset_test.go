package dynamo_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/limitertest"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestReset: every algorithm's Peek takes nothing and Reset gives a key
// its capacity back, one limit at a time (limitertest.RunReset), on
// DynamoDB Local behind the test cap proxy.
func TestReset(t *testing.T) {
	s, _, _ := newStore(t, dynamo.Config{})
	limitertest.RunReset(t, s)
}

// TestResetItem reads the item at the server: resetting a packed window
// of a key Name removes every attribute with the window's prefix and
// leaves the bucket's attributes of the same item as they were (values
// included) and the ttl; a reset of a Name without an item creates none.
func TestResetItem(t *testing.T) {
	s, _, client := newStore(t, dynamo.Config{})
	ctx := testCtx(t)
	now := limitertest.Base.Add(20 * time.Second)
	w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Name: "w", Limit: 5, Window: time.Minute, Representation: limiter.Packed})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.NewTokenBucket(s, limiter.TokenBucketConfig{Name: "b", MaxAmount: 3, RefillTime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	key := limitertest.Key(t)
	for i := range 4 {
		for _, l := range []limiter.Limiter{w, b} {
			if _, err := l.AllowN(ctx, key, now.Add(time.Duration(i)*5*time.Second), 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	pk := dynamo.ItemKey(storage.Key{Name: key})
	get := func() map[string]types.AttributeValue {
		t.Helper()
		out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tableName), Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}}, ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		return out.Item
	}
	wPre := dynamo.Attr("swp:5:1m0s:160:4", "")
	owned := func(item map[string]types.AttributeValue, pre string) []string {
		var names []string
		for n := range item {
			if strings.HasPrefix(n, pre) && n != "pk" && n != "ttl" {
				names = append(names, n)
			}
		}
		return names
	}
	before := get()
	if len(owned(before, wPre)) < 4 {
		t.Fatalf("the window wrote %v: want its counters in the item %v", owned(before, wPre), before)
	}
	bucket := map[string]string{}
	for _, n := range []string{dynamo.Attr(b.Space(), "b"), dynamo.Attr(b.Space(), "t")} {
		v, ok := before[n].(*types.AttributeValueMemberN)
		if !ok {
			t.Fatalf("no bucket attribute %s in %v", n, before)
		}
		bucket[n] = v.Value
	}
	if err := w.Reset(ctx, key, now.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	after := get()
	if left := owned(after, wPre); len(left) > 0 {
		t.Fatalf("after the window's reset its attributes %v are still in the item", left)
	}
	for n, v := range bucket {
		if got, ok := after[n].(*types.AttributeValueMemberN); !ok || got.Value != v {
			t.Fatalf("after the window's reset the bucket's %s is %v, want %s (unchanged)", n, after[n], v)
		}
	}
	if _, ok := after["ttl"]; !ok {
		t.Fatalf("after the reset the item lost its ttl: %v", after)
	}
	if d, err := b.Peek(ctx, key, now.Add(15*time.Second)); err != nil || d.Remaining != 0 {
		t.Fatalf("the bucket after the window's reset: %+v, %v; want still empty", d, err)
	}

	none := limitertest.Key(t)
	if err := b.Reset(ctx, none, now); err != nil {
		t.Fatal(err)
	}
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tableName), Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: dynamo.ItemKey(storage.Key{Name: none})}}, ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item != nil {
		t.Fatalf("a reset of a key without an item: the item is %v (%v), want none", out.Item, err)
	}
}
