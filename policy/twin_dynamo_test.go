package policy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestTwinLimitsDynamo is TestTwinLimits on DynamoDB Local: the twins'
// counters are attributes of one item per key there (the key spaces'
// attribute prefixes), so they must differ by space, not by item.
func TestTwinLimitsDynamo(t *testing.T) {
	endpoint := testserver.DynamoDB(t)
	client := dynamodb.New(dynamodb.Options{BaseEndpoint: aws.String(endpoint), Region: "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		})})
	table := fmt.Sprintf("sluice-twins-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	s, err := dynamo.New(client, dynamo.Config{Table: table, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	testTwins(t, Options{Stores: map[string]storage.Store{"dynamo": s}, DefaultBackend: "dynamo"})
}
