package wiring

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/policy"
)

// TestRulesTableListsAndTiers: a rules table's lists item and tier items
// load with the rules (and so reload with them): a deny-listed address is
// denied with reason deny_list, a key whose tier item says pro gets the pro
// limit, others the default. A malformed item names itself.
func TestRulesTableListsAndTiers(t *testing.T) {
	client := dynamoEnv(t)
	table := createRulesTable(t, client)
	putRule(t, client, table, RulesListsItem, `{deny: {cidrs: ["192.0.2.0/28"]}, allow: {keys: {"header:X-Internal": [yes]}}}`, -1)
	putRule(t, client, table, "per-key", `{key: "{api_key}", tier: "{api_key}", tier_lookup: true,
		limits: [{algorithm: fixed_window, limit: 1, window: 1m}],
		tiers: {pro: [{algorithm: fixed_window, limit: 3, window: 1m}]}}`, 1)
	putTier := func(value, tier string) {
		t.Helper()
		_, err := client.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			RulesAttrName: &types.AttributeValueMemberS{Value: RulesTierPrefix + value},
			RulesAttrTier: &types.AttributeValueMemberS{Value: tier},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	putTier("key-pro", "pro")

	doc, tiers, err := LoadRulesDocument(t.Context(), client, table)
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Rules) != 1 || len(doc.Lists.Deny.CIDRs) != 1 || tiers["key-pro"] != "pro" {
		t.Fatalf("document %+v, tiers %v", doc, tiers)
	}

	b, _ := buildEnv(t, map[string]string{config.EnvRulesTable: table})
	// requestTo comes from 192.0.2.10: on the deny list.
	resp, res, err := b.Handler.Decide(t.Context(), requestTo("/x"))
	if err != nil || resp.Allowed() || res.Reason != policy.ReasonDenyList {
		t.Fatalf("deny-listed: %+v %+v %v", resp, res, err)
	}
	allowed := func(key string) int {
		n := 0
		for range 5 {
			ev := fmt.Appendf(nil, `{"type":"REQUEST","methodArn":"arn:aws:execute-api:us-east-1:1:api/prod/GET/x","httpMethod":"GET","path":"/x",
				"requestContext":{"stage":"prod","identity":{"sourceIp":"198.51.100.1","apiKey":%q}}}`, key)
			resp, _, err := b.Handler.Decide(t.Context(), ev)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Allowed() {
				n++
			}
		}
		return n
	}
	if pro, free := allowed("key-pro"), allowed("key-free"); pro != 3 || free != 1 {
		t.Errorf("allowed: pro key %d (want 3), free key %d (want 1)", pro, free)
	}

	putRule(t, client, table, RulesListsItem, `{deny: {cidrs: [not-an-address]}}`, -1)
	if _, _, err := LoadRulesDocument(t.Context(), client, table); err == nil || !strings.Contains(err.Error(), `item "#lists"`) || !strings.Contains(err.Error(), "deny.cidrs[0]") {
		t.Errorf("a bad lists item: %v", err)
	}
	putRule(t, client, table, RulesListsItem, `{}`, -1)
	putTier("key-x", "")
	if _, _, err := LoadRulesDocument(t.Context(), client, table); err == nil || !strings.Contains(err.Error(), `item "#tier:key-x"`) {
		t.Errorf("a tier item without a tier: %v", err)
	}
}
