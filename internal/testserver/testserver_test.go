package testserver

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// memcachedVersion asks the memcached at addr for its version.
func memcachedVersion(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "version\r\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "VERSION ") {
		return "", fmt.Errorf("unexpected reply %q", line)
	}
	return strings.TrimSpace(line), nil
}

// listTables calls DynamoDB's ListTables at endpoint with dummy credentials
// and returns the response body.
func listTables(endpoint string) (string, error) {
	req, err := http.NewRequest("POST", endpoint, strings.NewReader("{}"))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
	req.Header.Set("X-Amz-Date", "20260101T000000Z")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=dummy/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host;x-amz-date;x-amz-target, Signature=00")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %s: %s", resp.Status, body)
	}
	return string(body), nil
}

func refused(t *testing.T, addr string) {
	t.Helper()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("connect to %s after Stop succeeded, want refused", addr)
	}
}

func TestSharedServers(t *testing.T) {
	t.Parallel()
	if v, err := memcachedVersion(Memcached(t)); err != nil {
		t.Errorf("shared memcached: %v", err)
	} else {
		t.Logf("shared memcached: %s", v)
	}
	if body, err := listTables(DynamoDB(t)); err != nil {
		t.Errorf("shared DynamoDB Local: %v", err)
	} else if !strings.Contains(body, "TableNames") {
		t.Errorf("shared DynamoDB Local: ListTables returned %q", body)
	}
}

func TestMemcachedStopRestart(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartMemcached(t)
	t.Logf("memcached started on %s in %v", s.Addr(), time.Since(start))
	addr := s.Addr()
	if _, err := memcachedVersion(addr); err != nil {
		t.Fatalf("after start: %v", err)
	}
	s.Stop()
	refused(t, addr)
	s.Stop() // a second Stop does nothing
	start = time.Now()
	s.Restart()
	t.Logf("memcached restarted in %v", time.Since(start))
	if s.Addr() != addr {
		t.Fatalf("Addr changed across Restart: %s, then %s", addr, s.Addr())
	}
	if _, err := memcachedVersion(addr); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	s.Restart() // restarting a running server works too
	if _, err := memcachedVersion(addr); err != nil {
		t.Fatalf("after second restart: %v", err)
	}
}

func TestDynamoDBLocalStopRestart(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartDynamoDBLocal(t)
	t.Logf("DynamoDB Local started on %s in %v", s.Endpoint(), time.Since(start))
	if s.Endpoint() != "http://"+s.Addr() {
		t.Fatalf("Endpoint %q does not match Addr %q", s.Endpoint(), s.Addr())
	}
	if _, err := listTables(s.Endpoint()); err != nil {
		t.Fatalf("after start: %v", err)
	}
	addr := s.Addr()
	s.Stop()
	refused(t, addr)
	start = time.Now()
	s.Restart()
	t.Logf("DynamoDB Local restarted in %v", time.Since(start))
	if s.Addr() != addr {
		t.Fatalf("Addr changed across Restart: %s, then %s", addr, s.Addr())
	}
	if _, err := listTables(s.Endpoint()); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// fakeTB records Skipf and Fatalf, and ends the goroutine like the real ones.
type fakeTB struct {
	testing.TB
	skipped, fatal string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func call(f *fakeTB, fn func(testing.TB) string) {
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
}

func TestMissingServerSkipsOrFails(t *testing.T) {
	t.Setenv(EnvMemcached, "")
	t.Setenv(EnvDynamoDB, "")
	for _, fn := range []func(testing.TB) string{Memcached, DynamoDB} {
		t.Setenv(EnvRequireServers, "")
		f := &fakeTB{TB: t}
		call(f, fn)
		if f.skipped == "" || f.fatal != "" || !strings.Contains(f.skipped, "make test") {
			t.Errorf("without %s: skipped %q, fatal %q; want a skip that mentions make test", EnvRequireServers, f.skipped, f.fatal)
		}
		t.Setenv(EnvRequireServers, "1")
		f = &fakeTB{TB: t}
		call(f, fn)
		if f.fatal == "" || f.skipped != "" {
			t.Errorf("with %s=1: skipped %q, fatal %q; want a failure", EnvRequireServers, f.skipped, f.fatal)
		}
	}
}
