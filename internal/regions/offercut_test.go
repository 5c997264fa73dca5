package regions

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// cutState is a partition of one region among regions that share one
// table without lag (TestSharesTableOffers' cut cases): while it lasts,
// the cut region reads every other region's item as it last read it
// before the cut, and every other region reads the cut region's so, as
// replication cut at that moment would leave them (each region writes
// only its own item, and its processes read only that).
type cutState struct {
	mu     sync.Mutex
	region int // -1: none
}

func (c *cutState) set(r int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.region = r
}

func (c *cutState) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.region
}

// cutClient is region's client to the table, through the partition: last
// is the other regions' items as it last read them, by key.
type cutClient struct {
	TableClient
	region int
	cut    *cutState
	mu     sync.Mutex
	last   map[string]*dynamodb.GetItemOutput
}

func newCutClient(c TableClient, region int, cut *cutState) *cutClient {
	return &cutClient{TableClient: c, region: region, cut: cut, last: map[string]*dynamodb.GetItemOutput{}}
}

// GetItem answers a read of another region's item across the partition
// with the item as this region last read it before the cut (not found,
// if never).
func (c *cutClient) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	pk, _ := in.Key["pk"].(*types.AttributeValueMemberS)
	o := c.region
	if pk != nil {
		if n, err := strconv.Atoi(pk.Value[strings.LastIndexByte(pk.Value, '/')+1:]); err == nil {
			o = n
		}
	}
	if o == c.region {
		return c.TableClient.GetItem(ctx, in, opts...)
	}
	if r := c.cut.get(); r == o || r == c.region {
		c.mu.Lock()
		defer c.mu.Unlock()
		if out := c.last[pk.Value]; out != nil {
			return out, nil
		}
		return &dynamodb.GetItemOutput{}, nil
	}
	out, err := c.TableClient.GetItem(ctx, in, opts...)
	if err == nil {
		c.mu.Lock()
		c.last[pk.Value] = out
		c.mu.Unlock()
	}
	return out, err
}
