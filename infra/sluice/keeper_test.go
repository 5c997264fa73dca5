package sluice_test

import (
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/infra/sluice"
)

// TestKeeperSchedule: a rule with scope global on an eventual table gets
// the keeper: an EventBridge rule, rate(1 minute), invoking the authorizer
// function (no retry), whose timeout is sluice.KeeperTimeout (65 s). An
// eventual table without a global rule, and a global rule on MRSC, get
// neither: the function keeps Function.Timeout (3 s by default).
func TestKeeperSchedule(t *testing.T) {
	for _, tt := range []struct {
		name   string
		props  sluice.Props
		rules  string
		keeper bool
	}{
		{"EventualGlobal", sluice.Props{TableMode: sluice.TableEventual, TableRegions: []string{"eu-west-1", region}}, globalRule, true},
		{"EventualRegional", sluice.Props{TableMode: sluice.TableEventual, TableRegions: []string{"eu-west-1", region}}, rulesYAML, false},
		{"MRSCGlobal", sluice.Props{TableMode: sluice.TableMRSC}, globalRule, false},
	} {
		s := awscdk.NewStack(awscdk.NewApp(nil), jsii.String("Keeper"+tt.name), &awscdk.StackProps{Env: env})
		p := tt.props
		p.RestAPI, p.BootstrapDir, p.Rules = petsAPI(s), bootDir, sluice.Rules{YAML: tt.rules}
		r := sluice.New(s, "RateLimit", &p)
		if errs := r.Errors(); len(errs) != 0 {
			t.Errorf("%s: errors %q", tt.name, errs)
			continue
		}
		tmpl := assertions.Template_FromStack(s, nil)
		rules := tmpl.FindResources(jsii.String("AWS::Events::Rule"), map[string]any{
			"Properties": map[string]any{"ScheduleExpression": "rate(1 minute)"},
		})
		timeout := 3.0
		if tt.keeper {
			timeout = sluice.KeeperTimeout.Seconds()
			if len(*rules) != 1 {
				t.Errorf("%s: %d keeper schedules, want 1", tt.name, len(*rules))
			}
			fn := s.GetLogicalId(r.Function().Node().DefaultChild().(awscdk.CfnElement))
			tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{
				"ScheduleExpression": "rate(1 minute)",
				"State":              "ENABLED",
				"Targets": []any{assertions.Match_ObjectLike(&map[string]any{
					"Arn":         map[string]any{"Fn::GetAtt": []any{*fn, "Arn"}},
					"RetryPolicy": map[string]any{"MaximumRetryAttempts": 0},
				})},
			})
			tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Permission"), map[string]any{
				"Action": "lambda:InvokeFunction", "Principal": "events.amazonaws.com",
				"FunctionName": map[string]any{"Fn::GetAtt": []any{*fn, "Arn"}},
			})
		} else if len(*rules) != 0 {
			t.Errorf("%s: %d keeper schedules, want none", tt.name, len(*rules))
		}
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Description": "Sluice rate-limiting authorizer", "Timeout": timeout,
		})
	}
}
