package sluice

import (
	"fmt"
	"os"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awselasticache"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

var osStat = os.Stat

// serverlessPort is the port of an ElastiCache Serverless memcached
// endpoint, and the default of the others.
const serverlessPort = 11211

// cacheInfo is the memcached as the authorizer sees it.
type cacheInfo struct {
	addrs string // SLUICE_MEMCACHED_ADDRS (may hold tokens)
	tls   bool   // SLUICE_MEMCACHED_TLS
	proxy bool   // SLUICE_MEMCACHED_PROXY
	port  int
}

// subnets are the function's (and a created cache's) subnets.
func (r *RateLimiter) subnets() *awsec2.SubnetSelection {
	if r.props.VPC != nil {
		if r.props.VPCSubnets != nil {
			return r.props.VPCSubnets
		}
		return &awsec2.SubnetSelection{}
	}
	return &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED}
}

// buildNetwork uses the given VPC or, when a cache needs one, creates a VPC
// of isolated subnets only: no internet gateway, no NAT. The authorizer
// talks to memcached inside the VPC and to DynamoDB through a gateway
// endpoint whose policy allows only the authorizer's actions on its
// tables; Lambda ships its logs (and so the EMF metrics) outside the
// function's network, so nothing else is needed.
func (r *RateLimiter) buildNetwork() {
	p := &r.props
	switch {
	case p.VPC != nil:
		r.vpc = p.VPC
	case p.Cache.Mode == CacheNone:
		return // the function runs outside any VPC
	case p.Cache.Mode == CacheExisting:
		r.fail("VPC: required with Cache.Mode %q (the function must run where your cache is)", CacheExisting)
		return
	default:
		r.vpc = r.newVPC()
	}
	sg := awsec2.NewSecurityGroup(r, jsii.String("SecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              r.vpc,
		Description:      jsii.String("Sluice authorizer: egress to DynamoDB and memcached only"),
		AllowAllOutbound: jsii.Bool(false),
	})
	// DynamoDB: through the gateway endpoint of a created VPC (its only
	// route), through your routes otherwise. (The endpoint's prefix list
	// id is not available to a template without a lookup.)
	sg.AddEgressRule(awsec2.Peer_AnyIpv4(), awsec2.Port_Tcp(jsii.Number(443)), jsii.String("HTTPS to DynamoDB"), nil)
	r.sg = sg
}

func (r *RateLimiter) newVPC() awsec2.IVpc {
	p := &r.props
	flowLogs := awslogs.NewLogGroup(r, jsii.String("FlowLogs"), &awslogs.LogGroupProps{
		Retention:     p.Function.LogRetention,
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	vp := &awsec2.VpcProps{
		IpAddresses: awsec2.IpAddresses_Cidr(jsii.String(p.VPCCidr)),
		NatGateways: jsii.Number(0),
		SubnetConfiguration: &[]*awsec2.SubnetConfiguration{{
			Name:       jsii.String("private"),
			SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED,
			CidrMask:   jsii.Number(22),
		}},
		// Left false so that no custom-resource Lambda is added; nothing
		// in this VPC uses the default security group.
		RestrictDefaultSecurityGroup: jsii.Bool(false),
		FlowLogs: &map[string]*awsec2.FlowLogOptions{
			"Rejected": {
				Destination: awsec2.FlowLogDestination_ToCloudWatchLogs(flowLogs, nil),
				TrafficType: awsec2.FlowLogTrafficType_REJECT,
			},
		},
	}
	if len(p.VPCZones) > 0 {
		vp.AvailabilityZones = jsii.Strings(p.VPCZones...)
	} else {
		vp.MaxAzs = jsii.Number(2)
	}
	vpc := awsec2.NewVpc(r, jsii.String("Vpc"), vp)
	endpoint := vpc.AddGatewayEndpoint(jsii.String("DynamoDB"), &awsec2.GatewayVpcEndpointOptions{
		Service: awsec2.GatewayVpcEndpointAwsService_DYNAMODB(),
		Subnets: &[]*awsec2.SubnetSelection{r.subnets()},
	})
	for _, g := range r.tableGrants() {
		endpoint.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("Sluice" + g.sid),
			Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
			Actions:    jsii.Strings(g.actions...),
			Resources:  &[]*string{g.resource},
		}))
	}
	return vpc
}

// buildCache creates the cache (serverless or node-based) in the
// function's subnets, behind a security group whose only ingress is the
// cache port from the function's security group; or opens an existing
// cache's security group to the function.
func (r *RateLimiter) buildCache() {
	c := r.props.Cache
	if c.Mode == CacheNone || r.sg == nil {
		return
	}
	if c.Mode == CacheExisting {
		if c.SecurityGroup != nil {
			c.SecurityGroup.Connections().AllowFrom(r.sg, awsec2.Port_Tcp(jsii.Number(float64(c.Port))), jsii.String("memcached from the Sluice authorizer"))
		} else {
			r.sg.AddEgressRule(awsec2.Peer_Ipv4(r.vpc.VpcCidrBlock()), awsec2.Port_Tcp(jsii.Number(float64(c.Port))), jsii.String("memcached"), nil)
		}
		r.cache = &cacheInfo{addrs: c.Addrs, tls: *c.TLS, proxy: c.Proxy, port: c.Port}
		return
	}
	port := c.Port
	if c.Mode == CacheServerless {
		port = serverlessPort
	}
	sg := awsec2.NewSecurityGroup(r, jsii.String("CacheSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              r.vpc,
		Description:      jsii.String("Sluice memcached: reachable from the authorizer only"),
		AllowAllOutbound: jsii.Bool(false),
	})
	// Adds the ingress rule on the cache group and the matching egress rule
	// on the authorizer's group, nothing else.
	sg.Connections().AllowFrom(r.sg, awsec2.Port_Tcp(jsii.Number(float64(port))), jsii.String("memcached from the Sluice authorizer"))
	subnetIDs := r.vpc.SelectSubnets(r.subnets()).SubnetIds
	name := c.Name
	if name == "" {
		name = defaultCacheName(r)
	}
	if c.Mode == CacheServerless {
		r.cache = r.serverlessCache(c, name, subnetIDs, sg, port)
		return
	}
	r.cache = r.nodeCache(c, name, subnetIDs, sg, port)
}

// serverlessCache creates an ElastiCache Serverless memcached cache.
func (r *RateLimiter) serverlessCache(c *Cache, name string, subnetIDs *[]*string, sg awsec2.SecurityGroup, port int) *cacheInfo {
	sc := awselasticache.NewCfnServerlessCache(r, jsii.String("Cache"), &awselasticache.CfnServerlessCacheProps{
		Engine:              jsii.String("memcached"),
		ServerlessCacheName: jsii.String(name),
		MajorEngineVersion:  jsii.String("1.6"),
		Description:         jsii.String("Sluice rate-limit counters (regional)"),
		SubnetIds:           toAny(*subnetIDs),
		SecurityGroupIds:    &[]any{sg.SecurityGroupId()},
		CacheUsageLimits: &awselasticache.CfnServerlessCache_CacheUsageLimitsProperty{
			DataStorage: &awselasticache.CfnServerlessCache_DataStorageProperty{
				Maximum: jsii.Number(float64(c.MaxDataStorageGB)),
				Unit:    jsii.String("GB"),
			},
			EcpuPerSecond: &awselasticache.CfnServerlessCache_ECPUPerSecondProperty{
				Maximum: jsii.Number(float64(c.MaxECPUPerSecond)),
			},
		},
	})
	// One endpoint with shards behind it (a proxy that may reorder a
	// pipelined request); TLS only.
	return &cacheInfo{
		addrs: *awscdk.Fn_Join(jsii.String(":"), &[]*string{sc.AttrEndpointAddress(), sc.AttrEndpointPort()}),
		tls:   true,
		proxy: true,
		port:  port,
	}
}

// nodeCache creates a node-based memcached cluster.
func (r *RateLimiter) nodeCache(c *Cache, name string, subnetIDs *[]*string, sg awsec2.SecurityGroup, port int) *cacheInfo {
	group := awselasticache.NewCfnSubnetGroup(r, jsii.String("CacheSubnets"), &awselasticache.CfnSubnetGroupProps{
		Description: jsii.String("Sluice memcached subnets"),
		SubnetIds:   toAny(*subnetIDs),
	})
	azMode := "single-az"
	if c.Nodes > 1 {
		azMode = "cross-az"
	}
	cluster := awselasticache.NewCfnCacheCluster(r, jsii.String("Cache"), &awselasticache.CfnCacheClusterProps{
		Engine:                   jsii.String("memcached"),
		EngineVersion:            jsii.String(c.EngineVersion),
		ClusterName:              jsii.String(name),
		CacheNodeType:            jsii.String(c.NodeType),
		NumCacheNodes:            jsii.Number(float64(c.Nodes)),
		AzMode:                   jsii.String(azMode),
		Port:                     jsii.Number(float64(port)),
		CacheSubnetGroupName:     group.Ref(),
		VpcSecurityGroupIds:      jsii.Strings(*sg.SecurityGroupId()),
		TransitEncryptionEnabled: c.TLS,
	})
	if port == serverlessPort {
		cdknag.NagSuppressions_AddResourceSuppressions(cluster, &[]*cdknag.NagPackSuppression{{
			Id:     jsii.String("AwsSolutions-AEC5"),
			Reason: jsii.String("The cache is reachable only from the authorizer's security group; a non-default port adds no protection. Set Cache.Port to change it."),
		}}, nil)
	}
	return &cacheInfo{addrs: nodeAddresses(cluster, c.Nodes, port), tls: *c.TLS, port: port}
}

// defaultCacheName derives an ElastiCache name (lower case, at most 40
// characters, no "--") from the construct's path.
func defaultCacheName(r *RateLimiter) string {
	var b strings.Builder
	dash := true
	for _, c := range strings.ToLower(*r.Node().Path()) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9' && b.Len() > 0:
			b.WriteRune(c)
			dash = false
		case !dash:
			b.WriteByte('-')
			dash = true
		}
	}
	s := strings.TrimRight(b.String(), "-")
	if len(s) > 31 {
		s = strings.TrimRight(s[len(s)-31:], "-")
		s = strings.TrimLeft(s, "-0123456789")
	}
	if s == "" {
		s = "sluice"
	}
	return s + "-memcached"
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

func toAny(ss []*string) *[]any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return &out
}
