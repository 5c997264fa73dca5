package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// TableClient is the part of the DynamoDB API [CreateTable] uses.
type TableClient interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

var _ TableClient = (*dynamodb.Client)(nil)

// CreateTable creates the store's table (on-demand capacity, partition key
// "pk" of type String, no sort key), waits until it is ACTIVE, and enables
// TTL on the "ttl" attribute. A table that already exists is fine. It is
// meant for tests and local use: in AWS the CDK app creates the table.
func CreateTable(ctx context.Context, client TableClient, name string) error {
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(AttrPK), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(AttrPK), KeyType: types.KeyTypeHash}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("dynamo: create table %q: %w", name, mapError("create table", err))
	}
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 50*time.Millisecond, time.Second
	})
	maxWait := 5 * time.Minute
	if d, ok := ctx.Deadline(); ok {
		maxWait = time.Until(d)
	}
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}, maxWait); err != nil {
		return fmt.Errorf("dynamo: wait for table %q: %w", name, err)
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(AttrTTL),
			Enabled:       aws.Bool(true),
		},
	})
	if err != nil && !strings.Contains(err.Error(), "already enabled") {
		return fmt.Errorf("dynamo: enable TTL on table %q: %w", name, err)
	}
	return nil
}
