package config

import (
	"strings"
	"testing"
	"time"
)

func TestParsePublish(t *testing.T) {
	p, err := ParsePublish(envOf(map[string]string{
		EnvPublishNamespace: "AWS/Lambda", EnvPublishMetric: "ConcurrentExecutions",
		EnvPublishDimensions: "FunctionName=orders, Resource = orders:live", EnvPublishDivisor: "200",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if p.Statistic != "Maximum" || p.Period != time.Minute || p.Divisor != 200 || len(p.Dimensions) != 2 || p.Dimensions[1] != (Dimension{"Resource", "orders:live"}) {
		t.Errorf("ParsePublish = %+v", p)
	}
	back, err := ParsePublish(envOf(p.Env()))
	if err != nil || back.Divisor != p.Divisor || len(back.Dimensions) != 2 || back.Period != p.Period {
		t.Errorf("Env round trip = %+v, %v", back, err)
	}
	base := map[string]string{EnvPublishNamespace: "N", EnvPublishMetric: "M"}
	for name, v := range map[string]string{
		EnvPublishNamespace: "", EnvPublishMetric: "", EnvPublishDimensions: "FunctionName", EnvPublishStatistic: "Median",
		EnvPublishDivisor: "0", EnvPublishPeriod: "30s",
	} {
		env := map[string]string{}
		for k, x := range base {
			env[k] = x
		}
		env[name] = v
		if _, err := ParsePublish(envOf(env)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: err = %v, want one naming the variable", name, v, err)
		}
	}
	for _, v := range []string{"-1", "NaN", "Inf", "x"} {
		if _, err := ParsePublish(envOf(map[string]string{EnvPublishNamespace: "N", EnvPublishMetric: "M", EnvPublishDivisor: v})); err == nil {
			t.Errorf("divisor %q accepted", v)
		}
	}
}

func TestParseShadow(t *testing.T) {
	e, err := Parse(envOf(map[string]string{EnvShadow: "true"}))
	if err != nil || !e.Shadow {
		t.Errorf("Parse(shadow) = %v, %v", e.Shadow, err)
	}
	if _, err := Parse(envOf(map[string]string{EnvShadow: "perhaps"})); err == nil || !strings.Contains(err.Error(), EnvShadow) {
		t.Errorf("bad shadow: %v", err)
	}
}
