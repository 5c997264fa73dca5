package sluice

import (
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/policy"
)

// KeeperTimeout is the authorizer function's timeout when it runs the
// keeper of a global rule's regional shares (TableMode eventual): an
// EventBridge schedule invokes it every minute and the keeper loops until
// its remaining time less 3 s (regions.DefaultKeeperMargin), so that
// consecutive keepers overlap by about 2 s and a region always has one.
// API Gateway does not wait on the function's timeout (it waits at most
// 30 s for an authorizer, the bound Function.Timeout is checked against,
// and the authorizer bounds each decision by Function.Deadline), so
// authorizer invocations are unaffected; only a hung one runs longer. It
// replaces a shorter Function.Timeout.
const KeeperTimeout = 65 * time.Second

// keeperOn reports whether the function runs the keeper: a rule with
// scope global on an eventual table. (With rules from a table, unknown at
// synth, it does not: add the schedule yourself, or set the rule in the
// construct's rules.)
func (r *RateLimiter) keeperOn() bool {
	if r.props.TableMode != TableEventual || r.rules == nil {
		return false
	}
	for _, rule := range r.rules.rules {
		if rule.Scope == policy.ScopeGlobal {
			return true
		}
	}
	return false
}

// functionTimeout is the function's timeout: Function.Timeout, or
// KeeperTimeout with the keeper.
func (r *RateLimiter) functionTimeout() time.Duration {
	if r.keeperOn() {
		return max(r.props.Function.Timeout, KeeperTimeout)
	}
	return r.props.Function.Timeout
}

// buildKeeper invokes the authorizer function every minute with the
// schedule's event (source aws.events, detail-type Scheduled Event):
// functions/authz dispatches it to the keeper. No retry: the next
// minute's run is the retry.
func (r *RateLimiter) buildKeeper() {
	if !r.keeperOn() {
		return
	}
	awsevents.NewRule(r, jsii.String("Keeper"), &awsevents.RuleProps{
		Description: jsii.String("Runs the Sluice keeper of the global rules' regional shares every minute"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(1))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(r.function, &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(0),
		})},
	})
}
