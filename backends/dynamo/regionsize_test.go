package dynamo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// itemSizes samples the regions' items of a table run (every second,
// each region's own item from its own endpoint) and keeps, per part of
// the item, its mean and largest size in bytes as DynamoDB counts an
// item's size (attribute names and values): "item" the whole, "s" and
// "b" the ledger entry and the board, "s.<f>" and "b.<f>" (and
// "b.e.<f>") each JSON field of them.
type itemSizes struct {
	mu   sync.Mutex
	n    int
	sum  map[string]int
	peak map[string]int
	// sent counts the sampler's reads: they pass the regions' gates,
	// and a run's store requests leave them out.
	sent atomic.Int64
}

func (z *itemSizes) run(ctx context.Context, tb testing.TB, table, name string, eps []string) {
	clients := make([]*dynamodb.Client, len(eps))
	for i, ep := range eps {
		clients[i] = newClient(ep)
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for r, c := range clients {
			z.sent.Add(1)
			out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
				Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "regions/" + name + "/" + strconv.Itoa(r)}}})
			if err != nil || out.Item == nil {
				continue
			}
			z.add(itemParts(out.Item))
		}
	}
}

func (z *itemSizes) add(parts map[string]int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.sum == nil {
		z.sum, z.peak = map[string]int{}, map[string]int{}
	}
	z.n++
	for k, v := range parts {
		z.sum[k] += v
		z.peak[k] = max(z.peak[k], v)
	}
}

// String lists the parts of at least 20 bytes on average, largest first.
func (z *itemSizes) String() string {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.n == 0 {
		return "no item sampled"
	}
	keys := slices.Collect(maps.Keys(z.sum))
	slices.SortFunc(keys, func(a, b string) int { return z.sum[b] - z.sum[a] })
	var s []string
	for _, k := range keys {
		if z.sum[k]/z.n >= 20 {
			s = append(s, fmt.Sprintf("%s %d (max %d)", k, z.sum[k]/z.n, z.peak[k]))
		}
	}
	return fmt.Sprintf("%d samples: %s", z.n, strings.Join(s, ", "))
}

// itemParts is an item's size by part (see itemSizes).
func itemParts(m map[string]types.AttributeValue) map[string]int {
	parts := map[string]int{}
	total := 0
	for k, v := range m {
		n := len(k)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			n += len(v.Value)
			if k == "s" || k == "b" {
				jsonParts(parts, k, []byte(v.Value))
			}
		case *types.AttributeValueMemberN:
			n += (len(strings.TrimLeft(v.Value, "-0"))+1)/2 + 1
		default:
			n += 8
		}
		parts[k] = n
		total += n
	}
	parts["item"] = total
	return parts
}

// jsonParts adds each field of the JSON object raw (its key, colon,
// value and comma) as prefix.<key>, and the board's entry's fields.
func jsonParts(parts map[string]int, prefix string, raw []byte) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return
	}
	for k, v := range obj {
		parts[prefix+"."+k] = len(k) + 4 + len(v)
		if prefix == "b" && k == "e" {
			jsonParts(parts, "b.e", v)
		}
	}
}
