package stacks

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/infra/sluice"
)

// newGlobalTables defines the global tables in the primary region's stack
// (none elsewhere): the state table (sized by tableThroughput) and,
// optionally, the rules table, each with a replica in every configured
// region. Every region's stack then
// refers to its local replica by the table's fixed name.
func newGlobalTables(s awscdk.Stack, c *Config, primary bool) []awsdynamodb.TableV2 {
	if !primary {
		return nil
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

	var defined []awsdynamodb.TableV2
	if c.Rules.Table {
		// Rules change rarely and are cached by the authorizer: eventual
		// consistency is enough even when the state table is MRSC.
		defined = append(defined, awsdynamodb.NewTableV2(s, jsii.String("RulesTable"), &awsdynamodb.TablePropsV2{
			TableName:                        jsii.String(c.RulesTableName()),
			PartitionKey:                     &awsdynamodb.Attribute{Name: jsii.String(sluice.RulesPartitionKey), Type: awsdynamodb.AttributeType_STRING},
			Billing:                          awsdynamodb.Billing_OnDemand(nil),
			PointInTimeRecoverySpecification: pitr,
			Replicas:                         &replicas,
			MultiRegionConsistency:           awsdynamodb.MultiRegionConsistency_EVENTUAL,
			RemovalPolicy:                    removal,
		}))
	}
	size := c.TableThroughput.construct()
	defined = append(defined, awsdynamodb.NewTableV2(s, jsii.String("StateTable"), &awsdynamodb.TablePropsV2{
		TableName:                        jsii.String(c.TableName),
		PartitionKey:                     &awsdynamodb.Attribute{Name: jsii.String(sluice.StatePartitionKey), Type: awsdynamodb.AttributeType_STRING},
		Billing:                          size.Billing(),
		WarmThroughput:                   size.Warm(),
		TimeToLiveAttribute:              jsii.String(sluice.StateTTLAttribute),
		PointInTimeRecoverySpecification: pitr,
		Replicas:                         &replicas,
		MultiRegionConsistency:           consistency,
		RemovalPolicy:                    removal,
	}))
	return defined
}
