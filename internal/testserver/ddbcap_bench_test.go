package testserver

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// BenchmarkCapProxy measures what the cap proxy adds: the median latency
// of one raw UpdateItem (SDK client, 1 write unit, one key per call)
// straight to DynamoDB Local and through a proxy in the same run
// (p50-direct-us, p50-proxy-us), and the writes a second DynamoDB Local
// takes through the proxy from 16 goroutines on distinct keys
// (proxy-writes/s) and without it (direct-writes/s).
func BenchmarkCapProxy(b *testing.B) {
	local := DynamoDBLocal(b)
	p, err := newCapProxy(local, CapConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	table := fmt.Sprintf("sluice-cap-bench-%d", time.Now().UnixNano())
	ctx := context.Background()
	if _, err := ddbClient(p.URL()).CreateTable(ctx, createInput(table)); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	update := func(c *dynamodb.Client) error {
		_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(table), Key: item{"pk": s(fmt.Sprint("k", seq.Add(1)))},
			UpdateExpression: aws.String("ADD c :one"), ExpressionAttributeValues: item{":one": n("1")},
		})
		return err
	}
	direct, proxied := ddbClient(local), ddbClient(p.URL())
	for range 200 { // warm both paths (and Local's JIT)
		if err := update(direct); err != nil {
			b.Fatal(err)
		}
		if err := update(proxied); err != nil {
			b.Fatal(err)
		}
	}
	var dl, pl []time.Duration
	b.ResetTimer()
	for b.Loop() {
		for _, c := range []struct {
			c *dynamodb.Client
			l *[]time.Duration
		}{{direct, &dl}, {proxied, &pl}} {
			t0 := time.Now()
			if err := update(c.c); err != nil {
				b.Fatal(err)
			}
			*c.l = append(*c.l, time.Since(t0))
		}
	}
	b.StopTimer()
	p50 := func(l []time.Duration) float64 {
		slices.Sort(l)
		return float64(l[len(l)/2].Microseconds())
	}
	b.ReportMetric(p50(dl), "p50-direct-us")
	b.ReportMetric(p50(pl), "p50-proxy-us")
	rate := func(c *dynamodb.Client) float64 {
		const workers, per = 16, 250
		var wg sync.WaitGroup
		t0 := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					if err := update(c); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return workers * per / time.Since(t0).Seconds()
	}
	b.ReportMetric(rate(direct), "direct-writes/s")
	b.ReportMetric(rate(proxied), "proxy-writes/s")
	b.ReportMetric(0, "ns/op")
}
