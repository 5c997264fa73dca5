package wiring

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestCrossRegionStore: the DynamoDB store says its writes cross regions
// (storage.CrossRegionWriter, through its breaker) when SLUICE_TABLE_MODE
// is mrsc, and only then: the limits' capacity leases are then sized by
// the store's round trip (docs/leases.md).
func TestCrossRegionStore(t *testing.T) {
	endpoint := testserver.DynamoDB(t)
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_DYNAMODB": endpoint, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
		"AWS_SESSION_TOKEN": "", "AWS_REGION": "us-east-1", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	for _, mode := range []string{config.TableRegional, config.TableMRSC} {
		table := fmt.Sprintf("sluice-crossregion-%d", time.Now().UnixNano())
		env, err := ParseEnv(func(k string) string {
			return map[string]string{config.EnvDynamoTable: table, config.EnvTableMode: mode}[k]
		})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Build(context.Background(), env, Outputs{Stdout: discard{}, Stderr: discard{}, CreateTable: true})
		if err != nil {
			t.Fatal(err)
		}
		got, want := storage.WritesCrossRegions(b.Stores[BackendDynamo]), mode == config.TableMRSC
		b.Close()
		if got != want {
			t.Errorf("%s=%q: the DynamoDB store (%T) says its writes cross regions: %v, want %v", config.EnvTableMode, mode, b.Stores[BackendDynamo], got, want)
		}
	}
}
