package stacks

import (
	"fmt"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awselasticache"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// serverlessPort is the port of an ElastiCache Serverless memcached
// endpoint.
const serverlessPort = 11211

// cache is the region's memcached, as the authorizer sees it.
type cache struct {
	addrs string // SLUICE_MEMCACHED_ADDRS (may hold CloudFormation tokens)
	tls   bool   // SLUICE_MEMCACHED_TLS
	proxy bool   // SLUICE_MEMCACHED_PROXY: shards behind one endpoint may reorder a pipeline
}

// newCache builds the region's memcached in the isolated subnets, behind a
// security group whose only ingress is the cache port from the authorizer's
// security group. It returns nil in MemcachedNone mode.
func newCache(s awscdk.Stack, c *Config, net *network) *cache {
	m := c.Memcached
	if m.Mode == MemcachedNone {
		return nil
	}
	port := m.Port
	if m.Mode == MemcachedServerless {
		port = serverlessPort
	}
	sg := awsec2.NewSecurityGroup(s, jsii.String("CacheSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              net.vpc,
		Description:      jsii.String("Sluice memcached: reachable from the authorizer only"),
		AllowAllOutbound: jsii.Bool(false),
	})
	// Adds the ingress rule on the cache group and the matching egress rule
	// on the authorizer's group, nothing else.
	sg.Connections().AllowFrom(net.authorizerSG, awsec2.Port_Tcp(jsii.Number(float64(port))), jsii.String("memcached from the Sluice authorizer"))

	subnetIDs := net.vpc.SelectSubnets(net.subnets).SubnetIds
	name := strings.ToLower(c.StackPrefix) + "-memcached"

	if m.Mode == MemcachedServerless {
		sc := awselasticache.NewCfnServerlessCache(s, jsii.String("Cache"), &awselasticache.CfnServerlessCacheProps{
			Engine:              jsii.String("memcached"),
			ServerlessCacheName: jsii.String(name),
			MajorEngineVersion:  jsii.String("1.6"),
			Description:         jsii.String("Sluice rate-limit counters (regional)"),
			SubnetIds:           stringsToAny(*subnetIDs),
			SecurityGroupIds:    &[]any{sg.SecurityGroupId()},
			CacheUsageLimits: &awselasticache.CfnServerlessCache_CacheUsageLimitsProperty{
				DataStorage: &awselasticache.CfnServerlessCache_DataStorageProperty{
					Maximum: jsii.Number(float64(m.MaxDataStorageGB)),
					Unit:    jsii.String("GB"),
				},
				EcpuPerSecond: &awselasticache.CfnServerlessCache_ECPUPerSecondProperty{
					Maximum: jsii.Number(float64(m.MaxECPUPerSecond)),
				},
			},
		})
		// A serverless cache has one endpoint and shards behind it (a proxy
		// that may reorder a pipelined request); it only accepts TLS.
		return &cache{
			addrs: *awscdk.Fn_Join(jsii.String(":"), &[]*string{sc.AttrEndpointAddress(), sc.AttrEndpointPort()}),
			tls:   true,
			proxy: true,
		}
	}

	group := awselasticache.NewCfnSubnetGroup(s, jsii.String("CacheSubnets"), &awselasticache.CfnSubnetGroupProps{
		Description: jsii.String("Sluice memcached subnets"),
		SubnetIds:   stringsToAny(*subnetIDs),
	})
	azMode := "single-az"
	if m.Nodes > 1 {
		azMode = "cross-az"
	}
	cluster := awselasticache.NewCfnCacheCluster(s, jsii.String("Cache"), &awselasticache.CfnCacheClusterProps{
		Engine:                   jsii.String("memcached"),
		EngineVersion:            jsii.String(m.EngineVersion),
		ClusterName:              jsii.String(name),
		CacheNodeType:            jsii.String(m.NodeType),
		NumCacheNodes:            jsii.Number(float64(m.Nodes)),
		AzMode:                   jsii.String(azMode),
		Port:                     jsii.Number(float64(port)),
		CacheSubnetGroupName:     group.Ref(),
		VpcSecurityGroupIds:      jsii.Strings(*sg.SecurityGroupId()),
		TransitEncryptionEnabled: m.TLS,
	})
	if port == 11211 {
		cdknag.NagSuppressions_AddResourceSuppressions(cluster, &[]*cdknag.NagPackSuppression{{
			Id:     jsii.String("AwsSolutions-AEC5"),
			Reason: jsii.String("The cache is reachable only from the authorizer's security group in isolated subnets; a non-default port adds no protection. Set memcached.port to change it."),
		}}, nil)
	}
	return &cache{addrs: nodeAddresses(cluster, m.Nodes, port), tls: *m.TLS}
}

// nodeAddresses lists the cluster's node endpoints, which CloudFormation
// does not expose: only the configuration endpoint
// (<name>.<id>.cfg.<region-code>.cache.amazonaws.com) is an attribute. The
// node endpoints follow ElastiCache's naming, the configuration endpoint
// with "cfg" replaced by the node number 0001, 0002, ... The authorizer
// hashes keys over the list itself, so it needs every node.
func nodeAddresses(cluster awselasticache.CfnCacheCluster, n, port int) string {
	parts := awscdk.Fn_Split(jsii.String(".cfg."), cluster.AttrConfigurationEndpointAddress(), nil)
	addrs := make([]*string, n)
	for i := range addrs {
		addrs[i] = awscdk.Fn_Join(jsii.String(""), &[]*string{
			awscdk.Fn_Select(jsii.Number(0), parts),
			jsii.String(fmt.Sprintf(".%04d.", i+1)),
			awscdk.Fn_Select(jsii.Number(1), parts),
			jsii.String(fmt.Sprintf(":%d", port)),
		})
	}
	return *awscdk.Fn_Join(jsii.String(","), &addrs)
}

func stringsToAny(ss []*string) *[]any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return &out
}
