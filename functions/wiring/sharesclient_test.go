package wiring

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// TestSharesClientThrottle: the regional shares' requests (ledger entries,
// boards, the wants index) go to the table through the client, and a
// throttled one fails at once (one request at the server), as the
// store's own do, instead of the SDK default's retries after backoffs of
// up to seconds from a quota every key in the container shares. The
// server answers every request as DynamoDB answers a throttled one; the
// plain client, as it was, sends three.
func TestSharesClientThrottle(t *testing.T) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded."}`)) //nolint:errcheck // the client reads what it gets
	}))
	defer srv.Close()
	plain := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(srv.URL),
		Region:       "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		}),
	})
	in := &dynamodb.GetItemInput{TableName: aws.String("t"), Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}}
	for _, c := range []struct {
		name   string
		client *dynamodb.Client
		want   int64
	}{{"shares", sharesClient(plain), 1}, {"plain", plain, 3}} {
		got.Store(0)
		_, err := c.client.GetItem(t.Context(), in)
		var thr *types.ProvisionedThroughputExceededException
		if !errors.As(err, &thr) {
			t.Errorf("%s client: %v, want a ProvisionedThroughputExceededException", c.name, err)
		}
		if n := got.Load(); n != c.want {
			t.Errorf("%s client: %d requests for one throttled GetItem, want %d", c.name, n, c.want)
		}
	}
}
