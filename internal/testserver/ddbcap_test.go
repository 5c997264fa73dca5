package testserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

func ddbClient(endpoint string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "test"}, nil
		}),
	}, opts...)
}

var capTableSeq atomic.Int64

// capTable creates a fresh table (partition key "pk", a string) through
// endpoint and returns its name.
func capTable(t *testing.T, endpoint string) string {
	t.Helper()
	name := fmt.Sprintf("sluice-cap-test-%d-%d", time.Now().UnixNano(), capTableSeq.Add(1))
	if _, err := ddbClient(endpoint).CreateTable(t.Context(), createInput(name)); err != nil {
		t.Fatalf("create table: %v", err)
	}
	return name
}

func createInput(name string) *dynamodb.CreateTableInput {
	return &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
	}
}

type item = map[string]types.AttributeValue

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func n(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }

// The proxy's answer past a cap is a throttle to the SDK: a typed
// ProvisionedThroughputExceededException with its throttling reason and
// the table's ARN, a throttle to the retryer's classification, retried by
// the standard retryer (every attempt reaches the proxy and is counted
// there), and nothing reaches the server.
func TestCapProxyThrottleIsSDKThrottle(t *testing.T) {
	// 0.1 write units a second per partition: the first write takes the
	// burst and leaves a debt of 0.9 units, 9 s to pay back.
	p := NewCapProxy(t, DynamoDBLocal(t), CapConfig{Scale: 0.0001, Record: true})
	table := capTable(t, p.URL())
	var sent atomic.Int64
	client := ddbClient(p.URL(), func(o *dynamodb.Options) {
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = 4
			so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 5 * time.Millisecond, nil })
		})
		o.HTTPClient = &countingClient{n: &sent}
	})
	ctx := t.Context()
	put := func(pk string) error {
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s(pk), "v": n("1")}})
		return err
	}
	if err := put("hot"); err != nil {
		t.Fatalf("first write: %v", err)
	}
	mark, sentBefore := p.Len(), sent.Load()
	err := put("hot")
	var pte *types.ProvisionedThroughputExceededException
	if !errors.As(err, &pte) {
		t.Fatalf("second write: %v (%T), want a *types.ProvisionedThroughputExceededException", err, err)
	}
	if len(pte.ThrottlingReasons) != 1 || aws.ToString(pte.ThrottlingReasons[0].Reason) != ReasonWriteKeyRange ||
		!strings.HasPrefix(aws.ToString(pte.ThrottlingReasons[0].Resource), "arn:aws:dynamodb:") ||
		!strings.HasSuffix(aws.ToString(pte.ThrottlingReasons[0].Resource), ":table/"+table) {
		t.Errorf("throttling reasons %+v, want one %s on the table's ARN", pte.ThrottlingReasons, ReasonWriteKeyRange)
	}
	if pte.ErrorCode() != "ProvisionedThroughputExceededException" || pte.ErrorMessage() == "" {
		t.Errorf("code %q, message %q", pte.ErrorCode(), pte.ErrorMessage())
	}
	if got := retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err); got != aws.TrueTernary {
		t.Errorf("retry.DefaultThrottles says %v, want a throttle", got)
	}
	if !retry.NewStandard().IsErrorRetryable(err) {
		t.Error("the standard retryer does not retry it")
	}
	var maxErr *retry.MaxAttemptsError
	if !errors.As(err, &maxErr) || maxErr.Attempt != 4 {
		t.Errorf("error %v: want the retryer's MaxAttemptsError after 4 attempts", err)
	}
	reqs := p.Since(mark)
	if len(reqs) != 4 || sent.Load()-sentBefore != 4 {
		t.Fatalf("proxy saw %d requests (%d sent), want 4 attempts: %+v", len(reqs), sent.Load()-sentBefore, reqs)
	}
	for _, r := range reqs {
		if r.Op != "PutItem" || r.Status != http.StatusBadRequest {
			t.Errorf("attempt %+v, want PutItem answered 400", r)
		}
	}
	k := p.KeyStats(table, "hot")
	if k.Requests != 1 || k.Throttled != 4 || k.WriteUnits != 1 || k.ThrottledWriteUnits != 4 {
		t.Errorf("key counts %+v, want 1 forwarded (1 unit) and 4 throttled (4 units asked)", k)
	}
	if o := p.Stats().Ops["PutItem"]; o != (OpCounts{Forwarded: 1, Throttled: 4}) {
		t.Errorf("PutItem counts %+v", o)
	}
	// Nothing reached the server: the item is as the first write left it.
	out, err := ddbClient(DynamoDBLocal(t)).GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("hot")}, ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item["v"].(*types.AttributeValueMemberN).Value != "1" {
		t.Errorf("item after throttled writes: %v %v", out, err)
	}
}

// countingClient counts the HTTP requests the SDK sends (every attempt).
type countingClient struct{ n *atomic.Int64 }

func (c *countingClient) Do(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultClient.Do(r)
}

// The proxy refuses past a partition's cap and only there: writes sent at
// once to one key are admitted up to the burst (one second of the scaled
// rate) plus what refilled meanwhile, the rest throttled; another key of
// the same table is unaffected.
func TestCapProxyPartitionCap(t *testing.T) {
	const scale = 0.01 // 10 write units a second per partition, 40 per table
	p := NewCapProxy(t, DynamoDBLocal(t), CapConfig{Scale: scale})
	table := capTable(t, p.URL())
	client := ddbClient(p.URL(), func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} })
	ctx := t.Context()
	const sends, workers = 100, 8
	var admitted, throttled atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < sends; i += workers {
				_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
					TableName: aws.String(table), Key: item{"pk": s("hot")},
					UpdateExpression: aws.String("ADD c :one"), ExpressionAttributeValues: item{":one": n("1")},
				})
				var pte *types.ProvisionedThroughputExceededException
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.As(err, &pte):
					throttled.Add(1)
				default:
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	burst := PartitionWriteUnits * scale
	hi := burst + elapsed*burst + 1
	t.Logf("%d writes at once in %.3fs: %d admitted (cap: %.0f burst + %.0f/s), %d throttled", sends, elapsed, admitted.Load(), burst, burst, throttled.Load())
	if a := float64(admitted.Load()); a < burst || a > hi {
		t.Errorf("admitted %v, want between the burst %v and %.1f", a, burst, hi)
	}
	if throttled.Load() == 0 {
		t.Errorf("nothing throttled")
	}
	if admitted.Load()+throttled.Load() != sends {
		t.Errorf("admitted + throttled = %d, want %d", admitted.Load()+throttled.Load(), sends)
	}
	k := p.KeyStats(table, "hot")
	if k.Requests != admitted.Load() || k.Throttled != throttled.Load() || k.WriteUnits != float64(admitted.Load()) {
		t.Errorf("key counts %+v, want %d forwarded (1 unit each), %d throttled", k, admitted.Load(), throttled.Load())
	}
	// The server has exactly the admitted writes.
	out, err := ddbClient(DynamoDBLocal(t)).GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("hot")}, ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item["c"].(*types.AttributeValueMemberN).Value != fmt.Sprint(admitted.Load()) {
		t.Errorf("counter on the server: %v %v, want %d", out.Item["c"], err, admitted.Load())
	}
	// Another partition of the table is not throttled.
	for i := range 10 {
		if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s("cold"), "i": n(fmt.Sprint(i))}}); err != nil {
			t.Fatalf("write %d to another key: %v", i, err)
		}
	}
}

// The table's cap holds across keys: a new on-demand table's 4,000 write
// units a second (scaled), whatever the partitions.
func TestCapProxyTableCap(t *testing.T) {
	const scale = 0.005 // 5 write units a second per partition, 20 per table
	p := NewCapProxy(t, DynamoDBLocal(t), CapConfig{Scale: scale})
	table := capTable(t, p.URL())
	client := ddbClient(p.URL(), func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} })
	var admitted int
	var reasons []types.ThrottlingReason
	start := time.Now()
	for i := range 40 { // 40 keys, one write each: no partition over its cap
		_, err := client.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s(fmt.Sprint("k", i))}})
		var pte *types.ProvisionedThroughputExceededException
		switch {
		case err == nil:
			admitted++
		case errors.As(err, &pte):
			reasons = pte.ThrottlingReasons
		default:
			t.Fatal(err)
		}
	}
	// The table's second of burst (20), and its refill while the writes
	// ran (20 a second: on a loaded machine the 40 writes take longer).
	took := time.Since(start)
	most := 20 + int(math.Ceil(20*took.Seconds()))
	if admitted < 20 || admitted > most {
		t.Errorf("admitted %d of 40 one-per-key writes in %v; want the table's 20 and at most its refill meanwhile (%d in all)", admitted, took, most)
	}
	if most < 40 && (len(reasons) != 1 || aws.ToString(reasons[0].Reason) != ReasonWriteKeyRange) {
		t.Errorf("admitted %d of 40 in %v, last reasons %+v; want a write reason", admitted, took, reasons)
	}
}

// Units as DynamoDB bills them, computed from AWS's rules, and checked
// against what DynamoDB Local itself reports (ReturnConsumedCapacity) where
// it reports.
func TestCapProxyUnits(t *testing.T) {
	p := NewCapProxy(t, DynamoDBLocal(t), CapConfig{})
	table := capTable(t, p.URL())
	client := ddbClient(p.URL())
	ctx := t.Context()
	// local is the units Local reported, -1 when it reported none.
	check := func(name, pk string, wantW, wantR float64, local *types.ConsumedCapacity, before CapCounts) {
		t.Helper()
		k := p.KeyStats(table, pk)
		gotW, gotR := k.WriteUnits-before.WriteUnits, k.ReadUnits-before.ReadUnits
		if gotW != wantW || gotR != wantR {
			t.Errorf("%s: proxy counted %v write and %v read units, want %v and %v", name, gotW, gotR, wantW, wantR)
		}
		if local != nil {
			if l := aws.ToFloat64(local.CapacityUnits); l != wantW+wantR {
				t.Errorf("%s: DynamoDB Local reports %v units, AWS's rules give %v", name, l, wantW+wantR)
			} else {
				t.Logf("%s: %v units (DynamoDB Local agrees)", name, l)
			}
		} else {
			t.Logf("%s: %v units (DynamoDB Local reports none)", name, wantW+wantR)
		}
	}
	str := func(n int) string { return strings.Repeat("x", n) }

	// An item over 1 KB: "pk"+"big" (5) + "d"+1,495 bytes = 1,501 bytes: 2 units.
	k0 := p.KeyStats(table, "big")
	put, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s("big"), "d": s(str(1495))},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	if err != nil {
		t.Fatal(err)
	}
	check("put 1,501 bytes", "big", 2, 0, put.ConsumedCapacity, k0)

	// An update that grows an item across 1 KB: 805 bytes -> 1,105: billed
	// on the larger, 2 units; shrinking it back is billed on the larger too.
	k0 = p.KeyStats(table, "grow")
	put, err = client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s("grow"), "d": s(str(800))},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	if err != nil {
		t.Fatal(err)
	}
	check("put 807 bytes", "grow", 1, 0, put.ConsumedCapacity, k0)
	k0 = p.KeyStats(table, "grow")
	upd, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: item{"pk": s("grow")},
		UpdateExpression: aws.String("SET e = :e"), ExpressionAttributeValues: item{":e": s(str(300))},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	if err != nil {
		t.Fatal(err)
	}
	if upd.Attributes != nil {
		t.Errorf("update without ReturnValues returned attributes %v", upd.Attributes)
	}
	check("update 807 -> 1,108 bytes", "grow", 2, 0, upd.ConsumedCapacity, k0)
	k0 = p.KeyStats(table, "grow")
	upd, err = client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: item{"pk": s("grow")},
		UpdateExpression: aws.String("REMOVE e"), ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	if err != nil {
		t.Fatal(err)
	}
	check("update 1,108 -> 807 bytes", "grow", 2, 0, upd.ConsumedCapacity, k0)

	// A failed conditional write is billed on the item's size: 2 units.
	k0 = p.KeyStats(table, "big")
	_, err = client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: item{"pk": s("big")},
		UpdateExpression: aws.String("SET v = :v"), ConditionExpression: aws.String("attribute_not_exists(pk)"),
		ExpressionAttributeValues: item{":v": n("1")}, ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		t.Fatalf("conditional write: %v", err)
	}
	if ccf.Item != nil {
		t.Errorf("failed condition without ReturnValuesOnConditionCheckFailure returned the item")
	}
	check("failed condition on 1,501 bytes", "big", 2, 0, nil, k0)
	// On an absent item: the minimum, 1.
	k0 = p.KeyStats(table, "none")
	_, err = client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(table), Key: item{"pk": s("none")},
		ConditionExpression: aws.String("attribute_exists(pk)")})
	if !errors.As(err, &ccf) {
		t.Fatalf("conditional delete: %v", err)
	}
	check("failed condition on no item", "none", 1, 0, nil, k0)

	// A transaction: 2 units per item per started KB, on each item's key.
	ka, kb := p.KeyStats(table, "tx-a"), p.KeyStats(table, "big")
	tx, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: []types.TransactWriteItem{
			{Put: &types.Put{TableName: aws.String(table), Item: item{"pk": s("tx-a")}}},
			{Update: &types.Update{TableName: aws.String(table), Key: item{"pk": s("big")}, UpdateExpression: aws.String("SET v = :v"),
				ExpressionAttributeValues: item{":v": n("2")}}},
		},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		t.Fatal(err)
	}
	check("transaction: put of a small item", "tx-a", 2, 0, nil, ka)
	check("transaction: update of 1,501 -> 1,503 bytes", "big", 4, 0, nil, kb)
	if len(tx.ConsumedCapacity) == 1 {
		if l := aws.ToFloat64(tx.ConsumedCapacity[0].CapacityUnits); l != 6 {
			t.Errorf("transaction: DynamoDB Local reports %v units, AWS's rules give 6", l)
		} else {
			t.Logf("transaction: 6 units (DynamoDB Local agrees)")
		}
	}

	// Reads: 1 unit per started 4 KB strongly consistent, half that
	// eventually consistent.
	k0 = p.KeyStats(table, "big")
	get, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("big")}, ConsistentRead: aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	if err != nil {
		t.Fatal(err)
	}
	check("strongly consistent read of 1,503 bytes", "big", 0, 1, get.ConsumedCapacity, k0)
	k0 = p.KeyStats(table, "big")
	get, err = client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("big")},
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	if err != nil {
		t.Fatal(err)
	}
	check("eventually consistent read", "big", 0, 0.5, get.ConsumedCapacity, k0)
	k0 = p.KeyStats(table, "huge")
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s("huge"), "d": s(str(9000))}}); err != nil {
		t.Fatal(err)
	}
	get, err = client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("huge")}, ConsistentRead: aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
	if err != nil {
		t.Fatal(err)
	}
	k1 := p.KeyStats(table, "huge")
	if w, r := k1.WriteUnits-k0.WriteUnits, k1.ReadUnits-k0.ReadUnits; w != 9 || r != 3 {
		t.Errorf("9,007-byte item: %v write and %v read units, want 9 and 3", w, r)
	}
	if l := aws.ToFloat64(get.ConsumedCapacity.CapacityUnits); l != 3 {
		t.Errorf("9,007-byte read: DynamoDB Local reports %v, AWS's rules give 3", l)
	}
}

// The client sees the server's answer byte for byte: the members the proxy
// adds to a request (ReturnValues, ReturnValuesOnConditionCheckFailure) are
// cut from the answer, and its checksum matches.
func TestCapProxyAnswersUnchanged(t *testing.T) {
	p := NewCapProxy(t, DynamoDBLocal(t), CapConfig{})
	table := capTable(t, p.URL())
	call := func(endpoint, op, body string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", endpoint, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("x-amz-crc32"), string(b)
	}
	steps := []struct{ op, body string }{
		{"UpdateItem", `{"TableName":"T","Key":{"pk":{"S":"K"}},"UpdateExpression":"SET v = :v","ExpressionAttributeValues":{":v":{"N":"1"}}}`},
		{"UpdateItem", `{"TableName":"T","Key":{"pk":{"S":"K"}},"UpdateExpression":"SET v = :v","ExpressionAttributeValues":{":v":{"N":"2"}},"ReturnConsumedCapacity":"TOTAL"}`},
		{"UpdateItem", `{"TableName":"T","Key":{"pk":{"S":"K"}},"UpdateExpression":"SET v = :v","ExpressionAttributeValues":{":v":{"N":"3"}},"ReturnValues":"UPDATED_OLD"}`},
		{"UpdateItem", `{"TableName":"T","Key":{"pk":{"S":"K"}},"UpdateExpression":"SET v = :v","ExpressionAttributeValues":{":v":{"N":"4"}},"ReturnValues":"ALL_OLD","ReturnConsumedCapacity":"TOTAL"}`},
		{"UpdateItem", `{"TableName":"T","Key":{"pk":{"S":"K"}},"UpdateExpression":"SET v = :v","ConditionExpression":"v = :w","ExpressionAttributeValues":{":v":{"N":"1"},":w":{"N":"9"}}}`},
		{"UpdateItem", `{"TableName":"T","Key":{"pk":{"S":"K"}},"UpdateExpression":"SET v = :v","ConditionExpression":"v = :w","ExpressionAttributeValues":{":v":{"N":"1"},":w":{"N":"9"}},"ReturnValuesOnConditionCheckFailure":"ALL_OLD"}`},
		{"PutItem", `{"TableName":"T","Item":{"pk":{"S":"K"},"x":{"S":"y"}},"ReturnConsumedCapacity":"TOTAL"}`},
		{"PutItem", `{"TableName":"T","Item":{"pk":{"S":"K"},"x":{"S":"z"}}}`},
		{"PutItem", `{"TableName":"T","Item":{"pk":{"S":"K"}},"ConditionExpression":"attribute_not_exists(pk)"}`},
		{"GetItem", `{"TableName":"T","Key":{"pk":{"S":"K"}}}`},
		{"DeleteItem", `{"TableName":"T","Key":{"pk":{"S":"K"}}}`},
		{"DeleteItem", `{"TableName":"T","Key":{"pk":{"S":"K"}},"ReturnValues":"ALL_OLD"}`},
		{"UpdateItem", `{ "TableName" : "T", "Key" : {"pk":{"S":"K"}}, "UpdateExpression":"SET v = :v", "ExpressionAttributeValues":{":v":{"N":"1"}} }`},
	}
	for i, st := range steps {
		direct := strings.ReplaceAll(strings.ReplaceAll(st.body, `"T"`, `"`+table+`"`), `"K"`, `"direct"`)
		proxied := strings.ReplaceAll(strings.ReplaceAll(st.body, `"T"`, `"`+table+`"`), `"K"`, `"proxied"`)
		ds, dc, db := call(DynamoDBLocal(t), st.op, direct)
		ps, pc, pb := call(p.URL(), st.op, proxied)
		pb = strings.ReplaceAll(pb, `"proxied"`, `"direct"`)
		if dc != "" && pb == db {
			pc = dc // the key is in the body: compare checksums only when the bodies are equal as sent
		}
		if ds != ps || db != pb || dc != pc {
			t.Errorf("step %d %s: direct %d %q crc %s\nproxied %d %q crc %s", i, st.op, ds, db, dc, ps, pb, pc)
		}
	}
	// The checksum of an edited answer is computed again (the SDK checks it).
	_, crc, body := call(p.URL(), "UpdateItem", `{"TableName":"`+table+`","Key":{"pk":{"S":"c"}},"UpdateExpression":"SET v = :v","ExpressionAttributeValues":{":v":{"N":"1"}},"ReturnConsumedCapacity":"TOTAL"}`)
	if want := fmt.Sprint(crc32.ChecksumIEEE([]byte(body))); crc != want {
		t.Errorf("x-amz-crc32 %s, want %s for %q", crc, want, body)
	}
}

func TestRemoveMember(t *testing.T) {
	for _, c := range []struct{ in, name, want string }{
		{`{"Attributes":{"a":{"S":"x"}},"ConsumedCapacity":{"CapacityUnits":1.0}}`, "Attributes", `{"ConsumedCapacity":{"CapacityUnits":1.0}}`},
		{`{"Attributes":{"a":{"S":"x"}}}`, "Attributes", `{}`},
		{`{"__type":"x","Message":"m","Item":{"a":{"N":"1"}}}`, "Item", `{"__type":"x","Message":"m"}`},
		{`{"a":1,"Item":2,"b":3}`, "Item", `{"a":1,"b":3}`},
		{`{"a":1}`, "Item", `{"a":1}`},
	} {
		if got, _ := removeMember([]byte(c.in), c.name); string(got) != c.want {
			t.Errorf("removeMember(%s, %s) = %s, want %s", c.in, c.name, got, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{`{}`, `{"R":"X"}`},
		{`{"a":1}`, `{"a":1,"R":"X"}`},
		{`{"R":"NONE","a":1}`, `{"a":1,"R":"X"}`},
		{` { "a" : 1 } `, ` { "a" : 1 ,"R":"X"}`},
	} {
		if got, err := setMember([]byte(c.in), "R", `"X"`); err != nil || string(got) != c.want {
			t.Errorf("setMember(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

func TestItemSize(t *testing.T) {
	for _, c := range []struct {
		item string
		want int64
	}{
		{`{"pk":{"S":"abc"}}`, 5},
		{`{"pk":{"S":"é"}}`, 4},                        // UTF-8 bytes
		{`{"n":{"N":"123"}}`, 1 + 3},                   // 3 digits: 2 bytes + 1
		{`{"n":{"N":"-0.00120"}}`, 1 + 2},              // "12": 1 byte + 1
		{`{"n":{"N":"1000"}}`, 1 + 2},                  // "1": trailing zeros trimmed
		{`{"n":{"N":"12345678901234567890"}}`, 1 + 11}, // 20 digits
		{`{"b":{"B":"AAEC"}}`, 1 + 3},                  // 3 raw bytes
		{`{"t":{"BOOL":true},"z":{"NULL":true}}`, 4},
		{`{"m":{"M":{}}}`, 1 + 3},
		{`{"m":{"M":{"ab":{"S":"xyz"}}}}`, 1 + 3 + 2 + 3 + 1},
		{`{"l":{"L":[{"N":"1"},{"S":"ab"}]}}`, 1 + 3 + (2 + 1) + (2 + 1)},
		{`{"s":{"SS":["a","bc"]}}`, 1 + 3},
	} {
		var m attrs
		if err := json.Unmarshal([]byte(c.item), &m); err != nil {
			t.Fatal(err)
		}
		if got, err := itemSize(m); err != nil || got != c.want {
			t.Errorf("itemSize(%s) = %d, %v; want %d", c.item, got, err, c.want)
		}
	}
	for _, c := range []struct {
		size int64
		w    float64
		r    float64
	}{{0, 1, 1}, {1024, 1, 1}, {1025, 2, 1}, {4096, 4, 1}, {4097, 5, 2}} {
		if w, r := writeUnits(c.size), readUnits(c.size, true); w != c.w || r != c.r || readUnits(c.size, false) != c.r/2 {
			t.Errorf("size %d: %v write, %v read units; want %v, %v", c.size, w, r, c.w, c.r)
		}
	}
}

// DynamoDB returns the shared cap proxy by default, DynamoDB Local itself
// when the cap is off.
func TestDynamoDBIsCapped(t *testing.T) {
	local := DynamoDBLocal(t)
	capped := DynamoDB(t)
	p := DynamoDBCap(t)
	if p == nil || capped != p.URL() || capped == local {
		t.Fatalf("DynamoDB = %s, DynamoDBLocal = %s, want the shared cap proxy", capped, local)
	}
	table := capTable(t, capped)
	if _, err := ddbClient(capped).PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item{"pk": s("k")}}); err != nil {
		t.Fatal(err)
	}
	if k := p.KeyStats(table, "k"); k.Requests != 1 || k.WriteUnits != 1 {
		t.Errorf("shared proxy counted %+v", k)
	}
	t.Setenv(EnvDynamoDBCap, "off")
	if got := DynamoDB(t); got != local {
		t.Errorf("with %s=off: %s, want %s", EnvDynamoDBCap, got, local)
	}
	t.Setenv(EnvDynamoDBCap, "fast")
	f := &fakeTB{TB: t}
	call(f, DynamoDB)
	if !strings.Contains(f.fatal, EnvDynamoDBCap) {
		t.Errorf("a bad %s: %q, want a failure naming it", EnvDynamoDBCap, f.fatal)
	}
}

// A write of an item a write holds alone (a transaction) waits for it,
// and is counted in ItemWaits and ItemWait; a wait whose client gives up
// ends, and its write is never sent; writes one after another wait for
// nothing.
func TestCapProxyCountsItemWaits(t *testing.T) {
	p := NewCapProxy(t, DynamoDBLocal(t), CapConfig{})
	table := capTable(t, p.URL())
	client := ddbClient(p.URL(), func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} })
	ctx := t.Context()
	update := func(ctx context.Context) error {
		_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: item{"pk": s("w")},
			UpdateExpression: aws.String("ADD n :one"), ExpressionAttributeValues: item{":one": &types.AttributeValueMemberN{Value: "1"}}})
		return err
	}
	for range 2 {
		if err := update(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := p.Stats(); st.ItemWaits != 0 || st.ItemWait != 0 {
		t.Fatalf("two writes one after another: %d waits (%v) counted, want none", st.ItemWaits, st.ItemWait)
	}
	ti, err := p.reg.table(ctx, p, table)
	if err != nil {
		t.Fatal(err)
	}
	_, id, err := ti.keys(attrs{"pk": json.RawMessage(`{"S":"w"}`)})
	if err != nil {
		t.Fatal(err)
	}
	hold := func() *flight {
		t.Helper()
		f, _, err := ti.begin(ctx, id, true) // as a transaction would
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	waitFor := func(done chan error) {
		t.Helper()
		for ti.waiters(id) == 0 {
			select {
			case err := <-done:
				t.Fatalf("a write went through while the item was held (err %v)", err)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
	}
	f := hold()
	done := make(chan error, 1)
	go func() { done <- update(ctx) }()
	waitFor(done)
	ti.withdraw(id, f)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	t.Logf("%d item waits, %v in all", st.ItemWaits, st.ItemWait)
	if st.ItemWaits != 1 || st.ItemWait <= 0 {
		t.Fatalf("a write that waited for its item: %d waits (%v) counted, want 1", st.ItemWaits, st.ItemWait)
	}
	// A client that gives up while its write waits: the write is never
	// sent, and the item's size is still known.
	k0 := p.KeyStats(table, "w")
	f = hold()
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- update(cctx) }()
	waitFor(done)
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a write whose client gave up while it waited succeeded")
	}
	for ti.waiters(id) != 0 {
		time.Sleep(time.Millisecond)
	}
	ti.withdraw(id, f)
	if k := p.KeyStats(table, "w"); k.Requests != k0.Requests || k.WriteUnits != k0.WriteUnits {
		t.Errorf("a write that gave up waiting was counted: %+v, before %+v", k, k0)
	}
	if _, known := ti.exact(id); !known {
		t.Error("a write that gave up waiting left its item's size unknown")
	}
	out, err := ddbClient(DynamoDBLocal(t)).GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: item{"pk": s("w")}, ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item["n"].(*types.AttributeValueMemberN).Value != "3" {
		t.Errorf("item after a write that gave up waiting: %v %v, want n = 3", out, err)
	}
	p.Reset()
	if st := p.Stats(); st.ItemWaits != 0 || st.ItemWait != 0 {
		t.Fatalf("after Reset: %d waits (%v), want none", st.ItemWaits, st.ItemWait)
	}
}

// gate is a proxy in front of DynamoDB Local that holds the UpdateItems it
// receives until n are held (or one has waited a second), then sends them
// to the server one at a time, in the order of rank (stable), and answers
// them all once the last is back: writes in flight at once, applied in a
// known order. Other requests pass straight on.
type gate struct {
	srv     *httptest.Server
	target  string
	n       int
	rank    func(body []byte) int
	mu      sync.Mutex
	held    []*heldReq
	batches []int // the size of each batch sent
}

type heldReq struct {
	h    http.Header
	body []byte
	u    *upstream
	err  error
	done chan struct{}
}

func newGate(t *testing.T, target string, n int, rank func([]byte) int) *gate {
	g := &gate{target: target, n: n, rank: rank}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gate) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if !strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".UpdateItem") {
		u, err := post(r.Context(), http.DefaultClient, g.target, r.Header, body)
		g.answer(w, u, err)
		return
	}
	h := &heldReq{h: r.Header, body: body, done: make(chan struct{})}
	g.mu.Lock()
	g.held = append(g.held, h)
	full := len(g.held) == g.n
	g.mu.Unlock()
	if full {
		g.release()
	}
	select {
	case <-h.done:
	case <-time.After(time.Second):
		g.release()
		<-h.done
	}
	g.answer(w, h.u, h.err)
}

// release sends the held batch, if any, and answers it.
func (g *gate) release() {
	g.mu.Lock()
	batch := g.held
	g.held = nil
	if len(batch) > 0 {
		g.batches = append(g.batches, len(batch))
	}
	g.mu.Unlock()
	slices.SortStableFunc(batch, func(a, b *heldReq) int { return g.rank(a.body) - g.rank(b.body) })
	for _, h := range batch {
		h.u, h.err = post(context.Background(), http.DefaultClient, g.target, h.h, h.body)
	}
	for _, h := range batch {
		close(h.done)
	}
}

func (g *gate) answer(w http.ResponseWriter, u *upstream, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	reply(w, u, false)
}

// The writes of one item go to the server as they come, as DynamoDB takes
// them, not one at a time: n UpdateItems sent at once are all in flight
// at the server together, none waits in the proxy, and each is billed as
// DynamoDB Local reports it (ADD on a small item: no candidate differs).
func TestCapProxyWritesOfOneItemOverlap(t *testing.T) {
	const n = 8
	g := newGate(t, DynamoDBLocal(t), n, func([]byte) int { return 0 })
	p := NewCapProxy(t, g.srv.URL, CapConfig{})
	table := capTable(t, p.URL())
	client := ddbClient(p.URL(), func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} })
	var wg sync.WaitGroup
	var local atomic.Int64 // units DynamoDB Local reports, in thousandths
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := client.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: item{"pk": s("hot")},
				UpdateExpression: aws.String("ADD c :one"), ExpressionAttributeValues: item{":one": n1()},
				ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal})
			if err != nil {
				t.Error(err)
				return
			}
			local.Add(int64(1000 * aws.ToFloat64(out.ConsumedCapacity.CapacityUnits)))
		}()
	}
	wg.Wait()
	g.mu.Lock()
	batches := slices.Clone(g.batches)
	g.mu.Unlock()
	st, k := p.Stats(), p.KeyStats(table, "hot")
	t.Logf("batches at the server %v; %d item waits, %d overlaps; %v units billed (%v uncertain), DynamoDB Local reports %v",
		batches, st.ItemWaits, st.Overlaps, k.WriteUnits, st.UncertainUnits, float64(local.Load())/1000)
	if !slices.Equal(batches, []int{n}) || st.ItemWaits != 0 || st.Overlaps != n {
		t.Errorf("%d writes of one item sent at once: batches %v in flight at the server, %d waited in the proxy, %d overlapped; want one batch of %d, none waiting, all overlapping",
			n, batches, st.ItemWaits, st.Overlaps, n)
	}
	if k.WriteUnits != float64(local.Load())/1000 || k.Requests != n || st.UncertainUnits != 0 {
		t.Errorf("billed %v units for %d requests (%v uncertain), DynamoDB Local reports %v", k.WriteUnits, k.Requests, st.UncertainUnits, float64(local.Load())/1000)
	}
}

func n1() types.AttributeValue { return &types.AttributeValueMemberN{Value: "1"} }

// Two UpdateItems in flight together, one growing an item past 1 KB and
// one shrinking it back, applied in either order: DynamoDB bills each on
// the larger of its before and after, and which before each had is the
// server's order. The proxy bills at least what DynamoDB Local reports and
// at most UncertainUnits more.
func TestCapProxyOverlapBillBounds(t *testing.T) {
	isShrink := func(b []byte) int {
		if strings.Contains(string(b), "REMOVE") {
			return 1
		}
		return 0
	}
	for _, c := range []struct {
		name string
		rank func([]byte) int
	}{
		{"grow-then-shrink", isShrink},
		{"shrink-then-grow", func(b []byte) int { return 1 - isShrink(b) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newGate(t, DynamoDBLocal(t), 2, c.rank)
			p := NewCapProxy(t, g.srv.URL, CapConfig{})
			table := capTable(t, p.URL())
			client := ddbClient(p.URL(), func(o *dynamodb.Options) { o.Retryer = aws.NopRetryer{} })
			if _, err := client.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(table),
				Item: item{"pk": s("k"), "d": s(strings.Repeat("x", 990))}}); err != nil {
				t.Fatal(err)
			}
			k0, s0 := p.KeyStats(table, "k"), p.Stats()
			var wg sync.WaitGroup
			var local atomic.Int64
			for _, in := range []*dynamodb.UpdateItemInput{
				{UpdateExpression: aws.String("SET e = :e"), ExpressionAttributeValues: item{":e": s(strings.Repeat("y", 300))}},
				{UpdateExpression: aws.String("REMOVE e")},
			} {
				in.TableName, in.Key, in.ReturnConsumedCapacity = aws.String(table), item{"pk": s("k")}, types.ReturnConsumedCapacityTotal
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, err := client.UpdateItem(t.Context(), in)
					if err != nil {
						t.Error(err)
						return
					}
					local.Add(int64(1000 * aws.ToFloat64(out.ConsumedCapacity.CapacityUnits)))
				}()
			}
			wg.Wait()
			k, st := p.KeyStats(table, "k"), p.Stats()
			g.mu.Lock()
			batches := slices.Clone(g.batches)
			g.mu.Unlock()
			billed, unsure, truth := k.WriteUnits-k0.WriteUnits, st.UncertainUnits-s0.UncertainUnits, float64(local.Load())/1000
			t.Logf("batches %v: billed %v units, %v of them uncertain (%d writes); DynamoDB Local reports %v", batches, billed, unsure, st.UncertainWrites, truth)
			if !slices.Equal(batches, []int{2}) {
				t.Errorf("batches %v at the server, want the two writes in flight together", batches)
			}
			if billed < truth || billed-unsure > truth {
				t.Errorf("billed %v units, %v uncertain: DynamoDB Local's %v is not between %v and %v", billed, unsure, truth, billed-unsure, billed)
			}
			if st.Overlaps-s0.Overlaps != 2 {
				t.Errorf("%d overlaps counted, want 2", st.Overlaps-s0.Overlaps)
			}
		})
	}
}
