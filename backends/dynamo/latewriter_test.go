package dynamo_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/limiter/limitertest"
)

// failMoves is a client on which every move of a late window writer (the
// second UpdateItem of a writer past the horizon) fails: just before it,
// another writer removes the counter the move takes the units from.
type failMoves struct {
	dynamo.Client
	moves atomic.Int64
}

// isMove reports whether in is a late writer's move: it takes n from one
// counter on condition that it holds n, and adds n to another.
func isMove(in *dynamodb.UpdateItemInput) bool {
	return strings.HasPrefix(aws.ToString(in.ConditionExpression), "#a >= :n") && strings.HasPrefix(aws.ToString(in.UpdateExpression), "ADD #a :m, #b :n")
}

func (c *failMoves) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if isMove(in) {
		c.moves.Add(1)
		if _, err := c.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: in.TableName, Key: in.Key,
			UpdateExpression:         aws.String("REMOVE #a"),
			ExpressionAttributeNames: map[string]string{"#a": in.ExpressionAttributeNames["#a"]},
		}, optFns...); err != nil {
			return nil, err
		}
	}
	return c.Client.UpdateItem(ctx, in, optFns...)
}

// A late writer whose move fails is never admitted: the conformance
// sequence limitertest.LateWriters on a client that makes every move
// fail. (At 7ea8043 the fixed window ignored the Later of the failed
// move's answer and admitted the late calls: counted nowhere.)
func TestLateWriterFailedMove(t *testing.T) {
	c := &failMoves{Client: newClient(sharedEndpoint(t))}
	s, err := dynamo.New(c, dynamo.Config{Table: tableName})
	if err != nil {
		t.Fatal(err)
	}
	limitertest.LateWriters(t, s)
	if c.moves.Load() == 0 {
		t.Fatal("no late writer was moved: the sequence did not reach the case")
	}
	t.Logf("%d moves failed on purpose; Stats.Moves %d", c.moves.Load(), s.Stats().Moves)
}
