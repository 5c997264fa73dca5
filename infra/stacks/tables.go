package stacks

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/jsii-runtime-go"
)

// Attribute names shared with the authorizer (backends/dynamo).
const (
	StatePartitionKey = "pk"   // String
	StateTTLAttribute = "ttl"  // Number, epoch seconds
	RulesPartitionKey = "name" // String
)

// Actions the authorizer performs, and nothing more: the methods of the
// DynamoDB client interfaces it is written against (backends/dynamo's
// Client, used by the rate-limit store and by the load shedders' lease and
// gauge store alike; functions/authz's ScanAPI for the rules table).
// TestIAMMatchesClientInterfaces reads those interfaces from the source.
var (
	stateTableActions = []string{"dynamodb:GetItem", "dynamodb:UpdateItem"}
	rulesTableActions = []string{"dynamodb:Scan"}
)

// tables names the region's replicas of the state table and, optionally,
// the rules table.
type tables struct {
	stateName, stateARN string
	rulesName, rulesARN string // "" without a rules table
	// defined are the table constructs of the primary stack (none
	// elsewhere), for the authorizer to depend on.
	defined []awsdynamodb.TableV2
}

// newTables defines the global tables in the primary region's stack and,
// in every stack, the ARNs of the local replicas. The ARN is built from the
// stack's own region and account with the table's fixed name: the same
// string in every region, with no cross-stack reference, which keeps the
// IAM policy (and the VPC endpoint policy) scoped to the local replica.
func newTables(s awscdk.Stack, c *Config, primary bool) *tables {
	t := &tables{stateName: c.TableName, stateARN: tableARN(s, c.TableName)}
	if c.Rules.Table {
		t.rulesName = c.RulesTableName()
		t.rulesARN = tableARN(s, t.rulesName)
	}
	if !primary {
		return t
	}

	removal := awscdk.RemovalPolicy_DESTROY
	if *c.RetainTables {
		removal = awscdk.RemovalPolicy_RETAIN
	}
	var replicas []*awsdynamodb.ReplicaTableProps
	for _, r := range c.ReplicaRegions() {
		replicas = append(replicas, &awsdynamodb.ReplicaTableProps{Region: jsii.String(r)})
	}
	consistency := awsdynamodb.MultiRegionConsistency_EVENTUAL
	if c.Consistency == ConsistencyMRSC {
		consistency = awsdynamodb.MultiRegionConsistency_STRONG
	}
	pitr := &awsdynamodb.PointInTimeRecoverySpecification{PointInTimeRecoveryEnabled: jsii.Bool(true)}

	state := awsdynamodb.NewTableV2(s, jsii.String("StateTable"), &awsdynamodb.TablePropsV2{
		TableName:                        jsii.String(t.stateName),
		PartitionKey:                     &awsdynamodb.Attribute{Name: jsii.String(StatePartitionKey), Type: awsdynamodb.AttributeType_STRING},
		Billing:                          awsdynamodb.Billing_OnDemand(nil),
		TimeToLiveAttribute:              jsii.String(StateTTLAttribute),
		PointInTimeRecoverySpecification: pitr,
		Replicas:                         &replicas,
		MultiRegionConsistency:           consistency,
		RemovalPolicy:                    removal,
	})
	if c.Rules.Table {
		// Rules change rarely and are cached by the authorizer: eventual
		// consistency is enough even when the state table is MRSC.
		rules := awsdynamodb.NewTableV2(s, jsii.String("RulesTable"), &awsdynamodb.TablePropsV2{
			TableName:                        jsii.String(t.rulesName),
			PartitionKey:                     &awsdynamodb.Attribute{Name: jsii.String(RulesPartitionKey), Type: awsdynamodb.AttributeType_STRING},
			Billing:                          awsdynamodb.Billing_OnDemand(nil),
			PointInTimeRecoverySpecification: pitr,
			Replicas:                         &replicas,
			MultiRegionConsistency:           awsdynamodb.MultiRegionConsistency_EVENTUAL,
			RemovalPolicy:                    removal,
		})
		t.defined = append(t.defined, rules)
	}
	t.defined = append(t.defined, state)
	return t
}

func tableARN(s awscdk.Stack, name string) string {
	return *s.FormatArn(&awscdk.ArnComponents{
		Service:      jsii.String("dynamodb"),
		Resource:     jsii.String("table"),
		ResourceName: jsii.String(name),
	})
}
