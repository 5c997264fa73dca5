package wiring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/functions/authz"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// TestBuildShedderHook checks the hook that the load shedders plug into.
func TestBuildShedderHook(t *testing.T) {
	env, err := ParseEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var metrics bytes.Buffer
	var gotStores []string
	b, err := Build(t.Context(), env, Outputs{Stdout: &metrics, Stderr: io.Discard,
		Shedder: func(_ context.Context, _ Env, stores map[string]storage.Store) (limiter.Shedder, error) {
			for k := range stores {
				gotStores = append(gotStores, k)
			}
			return shedAll{}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var se *authz.ShedError
	if _, err := b.Handler.Handle(t.Context(), request("/api/x", "192.0.2.1")); !errors.As(err, &se) {
		t.Fatalf("err = %v, want a ShedError", err)
	}
	if strings.Join(gotStores, ",") != "memory" {
		t.Errorf("the hook saw stores %v", gotStores)
	}
	if _, err := Build(t.Context(), env, Outputs{Stdout: io.Discard, Stderr: io.Discard,
		Shedder: func(context.Context, Env, map[string]storage.Store) (limiter.Shedder, error) {
			return nil, errors.New("no lease store")
		}}); err == nil ||
		!strings.Contains(err.Error(), "load shedder: no lease store") {
		t.Errorf("a failing hook: %v", err)
	}
}

// shedAll sheds every request.
type shedAll struct{}

func (shedAll) Check(context.Context, limiter.Priority, time.Time) (limiter.Decision, error) {
	return limiter.Decision{RetryAfter: time.Second, Name: "test"}, nil
}
