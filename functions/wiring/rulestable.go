package wiring

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/policy"
)

// Attributes of a rules table item. The partition key is "name" (S); "rule"
// (S) holds the rule as YAML or JSON (the fields of one rules-list item;
// its name may be left out); "order" (N, optional) orders the rules
// (ascending, then by name; items without one come last).
const (
	RulesAttrName  = "name"
	RulesAttrRule  = "rule"
	RulesAttrOrder = "order"
	// RulesAttrTier holds a tier item's tier name.
	RulesAttrTier = "tier"
)

// Names of the items that are not rules (a rule's name cannot start with
// '#'): the allow and deny lists (RulesAttrRule holds them as YAML or JSON,
// as at the top of a rules document), and the tier items of rules with
// tier_lookup ("#tier:<value>", RulesAttrTier naming the tier).
const (
	RulesListsItem  = "#lists"
	RulesTierPrefix = "#tier:"
)

// ScanAPI is the part of the DynamoDB API LoadRulesTable uses.
type ScanAPI interface {
	Scan(ctx context.Context, in *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
}

var _ ScanAPI = (*dynamodb.Client)(nil)

// LoadRulesTable reads every item of a rules table (a consistent scan,
// paginated) and parses each into a rule. An invalid item fails the whole
// load with an error naming the item and the field, so that a bad edit
// never half-applies.
func LoadRulesTable(ctx context.Context, client ScanAPI, table string) ([]policy.Rule, error) {
	doc, _, err := LoadRulesDocument(ctx, client, table)
	return doc.Rules, err
}

// LoadRulesDocument reads a rules table as LoadRulesTable does, with its
// lists item (RulesListsItem) and its tier items (RulesTierPrefix), so
// that they reload with the rules.
func LoadRulesDocument(ctx context.Context, client ScanAPI, table string) (policy.Document, policy.Tiers, error) {
	var doc policy.Document
	tiers := policy.Tiers{}
	rules, err := loadRulesTable(ctx, client, table, &doc.Lists, tiers)
	doc.Rules = rules
	return doc, tiers, err
}

// maxTierItems bounds the tier items of a rules table (they are held in
// memory by every authorizer instance).
const maxTierItems = 100000

// ruleEntry is a rule item of a rules table, with its order.
type ruleEntry struct {
	rule     policy.Rule
	order    float64
	hasOrder bool
}

func loadRulesTable(ctx context.Context, client ScanAPI, table string, lists *policy.Lists, tiers policy.Tiers) ([]policy.Rule, error) {
	var entries []ruleEntry
	in := &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)}
	for {
		out, err := client.Scan(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("rules table %s: %w", table, err)
		}
		for _, item := range out.Items {
			e, isRule, err := readRulesItem(item, lists, tiers)
			if err != nil {
				return nil, fmt.Errorf("rules table %s: %w", table, err)
			}
			if !isRule {
				continue
			}
			entries = append(entries, e)
			if len(entries) > policy.MaxRules {
				return nil, fmt.Errorf("rules table %s: more than %d rules", table, policy.MaxRules)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	slices.SortFunc(entries, func(a, b ruleEntry) int {
		if a.hasOrder != b.hasOrder {
			if a.hasOrder {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.order, b.order); c != 0 {
			return c
		}
		return cmp.Compare(a.rule.Name, b.rule.Name)
	})
	rules := make([]policy.Rule, len(entries))
	for i, e := range entries {
		rules[i] = e.rule
	}
	return rules, nil
}

// readRulesItem reads one item of a rules table: a tier item (into
// tiers), the lists item (into lists), or a rule (isRule).
func readRulesItem(item map[string]types.AttributeValue, lists *policy.Lists, tiers policy.Tiers) (e ruleEntry, isRule bool, err error) {
	name, ok := item[RulesAttrName].(*types.AttributeValueMemberS)
	if !ok || name.Value == "" {
		return e, false, fmt.Errorf("an item has no string %q attribute", RulesAttrName)
	}
	if value, ok := strings.CutPrefix(name.Value, RulesTierPrefix); ok {
		tier, ok := item[RulesAttrTier].(*types.AttributeValueMemberS)
		if !ok || value == "" || tier.Value == "" {
			return e, false, fmt.Errorf("item %q: a tier item needs a value after %q and a string attribute %q naming the tier", name.Value, RulesTierPrefix, RulesAttrTier)
		}
		if len(tiers) >= maxTierItems {
			return e, false, fmt.Errorf("more than %d tier items", maxTierItems)
		}
		tiers[value] = tier.Value
		return e, false, nil
	}
	body, ok := item[RulesAttrRule].(*types.AttributeValueMemberS)
	if !ok {
		return e, false, fmt.Errorf("item %q: want a string attribute %q holding the rule as YAML or JSON", name.Value, RulesAttrRule)
	}
	if name.Value == RulesListsItem {
		if *lists, err = policy.ParseLists([]byte(body.Value)); err != nil {
			return e, false, fmt.Errorf("item %q: %w", name.Value, err)
		}
		return e, false, nil
	}
	if e.rule, err = policy.ParseRule([]byte(body.Value), name.Value); err != nil {
		return e, false, fmt.Errorf("item %q: %w", name.Value, err)
	}
	if av, ok := item[RulesAttrOrder]; ok {
		n, ok := av.(*types.AttributeValueMemberN)
		if !ok {
			return e, false, fmt.Errorf("item %q: attribute %q must be a number", name.Value, RulesAttrOrder)
		}
		if e.order, err = strconv.ParseFloat(n.Value, 64); err != nil {
			return e, false, fmt.Errorf("item %q: attribute %q: %w", name.Value, RulesAttrOrder, err)
		}
		e.hasOrder = true
	}
	return e, true, nil
}
