package regions

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// ItemClient is the part of the DynamoDB client a [DynamoLedger] uses.
type ItemClient interface {
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
}

var _ ItemClient = (*dynamodb.Client)(nil)

// DynamoLedger keeps the ledger in a table with the dynamo store's
// layout (partition key "pk"): region r's entry is the item
// "regions/<Name>/<r>", its State as JSON in "s", written only through
// region r's Client (one item per region: last-writer-wins never meets
// two writers). Read is a strongly consistent read of the region's own
// replica.
type DynamoLedger struct {
	Client ItemClient
	Table  string
	Name   string
}

func (l *DynamoLedger) key(region int) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "regions/" + l.Name + "/" + strconv.Itoa(region)}}
}

// Publish writes region's entry.
func (l *DynamoLedger) Publish(ctx context.Context, region int, st State) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	item := l.key(region)
	item["s"] = &types.AttributeValueMemberS{Value: string(b)}
	_, err = l.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(l.Table), Item: item})
	return err
}

// Read returns region's entry as this replica holds it (false: none yet).
func (l *DynamoLedger) Read(ctx context.Context, region int) (State, bool, error) {
	out, err := l.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(l.Table), Key: l.key(region), ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item == nil {
		return State{}, false, err
	}
	v, ok := out.Item["s"].(*types.AttributeValueMemberS)
	if !ok {
		return State{}, false, fmt.Errorf("regions: ledger entry of region %d has no state", region)
	}
	var st State
	if err := json.Unmarshal([]byte(v.Value), &st); err != nil {
		return State{}, false, fmt.Errorf("regions: ledger entry of region %d: %w", region, err)
	}
	return st, true, nil
}
