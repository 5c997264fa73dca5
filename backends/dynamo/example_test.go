package dynamo_test

import (
	"context"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter"
)

// Build the client and the store once per process (at a Lambda's init) and
// reuse them: the store remembers the last state it saw per key.
func ExampleNew() {
	ctx := context.Background()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	store, err := dynamo.New(dynamodb.NewFromConfig(awsCfg), dynamo.Config{Table: "sluice-state"})
	if err != nil {
		log.Fatal(err)
	}
	bucket, err := limiter.NewTokenBucket(store, limiter.TokenBucketConfig{Name: "api", MaxAmount: 100, RefillTime: time.Second, RefillAmount: 10})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	d, err := bucket.Allow(ctx, "api-key-123", time.Now())
	if err != nil {
		log.Print(err) // the rule's fail mode decides (errors.Is(err, dynamo.ErrThrottled), ...)
		return
	}
	log.Print(d.Allowed, d.Remaining)
}
