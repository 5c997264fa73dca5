package memcached

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/internal/pending"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Defaults used when the corresponding Config field is zero.
const (
	DefaultTimeout           = 200 * time.Millisecond
	DefaultJitter            = time.Second
	DefaultMaxRetries        = 50
	DefaultRetryBackoff      = 200 * time.Microsecond
	DefaultCacheSize         = 1024
	DefaultDiscoveryInterval = time.Minute
	// maxRetryBackoff caps the jittered wait between two CAS attempts.
	maxRetryBackoff = 20 * time.Millisecond
)

// ErrUnavailable is wrapped by every error caused by the network or the
// server (refused or dropped connections, timeouts, server errors, a
// cancelled context): the cases where a rule's fail mode applies. The
// underlying error is wrapped too, so errors.Is(err,
// context.DeadlineExceeded) works.
var ErrUnavailable = fmt.Errorf("memcached: unavailable: %w", storage.ErrUnavailable)

// Config configures a [Store]. Either Addrs or AutoDiscovery is required.
type Config struct {
	// Addrs are the memcached nodes, host:port (or a Unix socket path).
	// Keys are spread over them by consistent hashing (see [Ring]).
	Addrs []string
	// AutoDiscovery is the host:port of an ElastiCache for Memcached
	// configuration endpoint. When set, the nodes are read from it with
	// "config get cluster" at New and every DiscoveryInterval.
	AutoDiscovery string
	// DiscoveryInterval is how often auto discovery refreshes the node
	// list. Zero means DefaultDiscoveryInterval; negative means only at
	// New (call Refresh yourself).
	DiscoveryInterval time.Duration

	// TLS, when not nil, makes every connection (nodes and the discovery
	// endpoint) use TLS, as ElastiCache Serverless and in-transit
	// encryption require. When its ServerName is empty, each connection
	// verifies the host of the address it dials (ServerName below, if set,
	// takes precedence).
	TLS *tls.Config
	// ServerName, when set, turns TLS on (with the system roots if TLS is
	// nil) and is the name the server's certificate is verified against.
	ServerName string

	// Timeout is the deadline of one Store call (Add, Sub, UpdateBucket,
	// UpdateLog, including CAS retries), unless ctx's is earlier. It is
	// also the socket read/write/dial timeout. Zero means DefaultTimeout.
	Timeout time.Duration
	// MaxIdleConns is the number of idle connections kept per node, in
	// each of the Store's two pools (window counters; buckets and logs
	// through gomemcache). A decision uses one connection at a time, so
	// set it to the number of concurrent decisions. Zero means
	// max(16, 4*GOMAXPROCS).
	MaxIdleConns int

	// KeyPrefix is put in front of every key (printable ASCII, at most
	// MaxKeyPrefix bytes), to share a cluster with other users.
	KeyPrefix string
	// Jitter is the largest random extra expiry added to every item, so
	// that keys written together do not all expire in the same second.
	// Zero means DefaultJitter; negative means none.
	Jitter time.Duration

	// Proxy says the nodes are a proxy that may run the commands of one
	// pipeline concurrently on different shards (ElastiCache Serverless,
	// mcrouter, twemproxy), keeping only each key's commands in order. A
	// request's batch then sends every write first and the windows' reads
	// after their replies, two round trips instead of one whatever the
	// number of limits (one for buckets, logs and fixed windows alone), so
	// that the windows stay exact (see the package comment).
	Proxy bool

	// MaxRetries bounds the CAS attempts of one UpdateBucket or
	// UpdateLog after a lost race; retries also stop at the call's
	// deadline. Zero means DefaultMaxRetries.
	MaxRetries int
	// RetryBackoff is the base of the random exponential wait between CAS
	// attempts. Zero means DefaultRetryBackoff.
	RetryBackoff time.Duration
	// CacheSize is the number of keys whose last read item (value and CAS
	// id) a Store remembers, so a warm key can write without reading
	// first. Zero means DefaultCacheSize; negative turns the cache off.
	CacheSize int

	// Breaker, when not nil, puts each node behind its own circuit
	// breaker (see [BreakerConfig] and the package comment): after
	// Breaker.Failures unavailable failures in a row on a node, calls
	// for its keys fail at once, for Breaker.OpenFor, then one probe at a
	// time; the other nodes are not affected. Nil: no breakers.
	Breaker *BreakerConfig
}

// Store keeps limiter state in memcached: sub-window counters for the
// windows ([storage.Counter]) and CAS-protected values for token buckets
// ([storage.BucketStore]) and sliding logs ([storage.LogStore]). The package
// comment describes the protocol. A Store is safe for concurrent use; create
// it with [New] (the zero value is not usable) and Close it when done.
type Store struct {
	mc         *memcache.Client
	ring       *Ring
	keys       keyer
	timeout    time.Duration
	proxy      bool
	pool       *pool // counter commands
	jitter     time.Duration
	maxRetries int
	backoff    time.Duration
	cache      *itemCache
	now        func() time.Time
	// refunds: bucket and log refunds Do sends without waiting (batch.go).
	refunds     *pending.Refunds
	lostRefunds atomic.Int64

	discovery struct {
		endpoint string
		dial     dialFunc
		mu       sync.Mutex
		version  int64
		stop     context.CancelFunc
		done     chan struct{}
	}
	closeOnce sync.Once
}

var (
	_ storage.Counter     = (*Store)(nil)
	_ storage.BucketStore = (*Store)(nil)
	_ storage.LogStore    = (*Store)(nil)
)

type dialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// New returns a Store for the nodes in cfg. It does not connect to the nodes
// (connections are made on first use), but with AutoDiscovery it asks the
// configuration endpoint for them and fails if it cannot. Configuration
// errors wrap limiter.ErrInvalidConfig.
func New(cfg Config) (*Store, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: memcached: %s", limiter.ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case len(cfg.Addrs) == 0 && cfg.AutoDiscovery == "":
		return nil, invalid("no Addrs and no AutoDiscovery endpoint")
	case len(cfg.Addrs) > 0 && cfg.AutoDiscovery != "":
		return nil, invalid("Addrs and AutoDiscovery are exclusive")
	case cfg.MaxIdleConns < 0:
		return nil, invalid("MaxIdleConns must not be negative, got %d", cfg.MaxIdleConns)
	case cfg.Timeout < 0:
		return nil, invalid("Timeout must not be negative, got %v", cfg.Timeout)
	case cfg.MaxRetries < 0:
		return nil, invalid("MaxRetries must not be negative, got %d", cfg.MaxRetries)
	case cfg.RetryBackoff < 0:
		return nil, invalid("RetryBackoff must not be negative, got %v", cfg.RetryBackoff)
	}
	keys, err := newKeyer(cfg.KeyPrefix)
	if err != nil {
		return nil, err
	}
	ring := new(Ring)
	if len(cfg.Addrs) > 0 {
		if err := ring.SetNodes(cfg.Addrs...); err != nil {
			return nil, fmt.Errorf("%w: %w", limiter.ErrInvalidConfig, err)
		}
	} else if _, err := parseAddr(cfg.AutoDiscovery); err != nil {
		return nil, invalid("AutoDiscovery: %v", err)
	}
	cfg.Timeout = orDefault(cfg.Timeout, DefaultTimeout)
	cfg.MaxIdleConns = orDefault(cfg.MaxIdleConns, max(16, 4*runtime.GOMAXPROCS(0)))
	breakers, err := newNodeBreakers(cfg.Breaker)
	if err != nil {
		return nil, err
	}
	dial := dialer(cfg)
	mc := memcache.NewFromSelector(clientSelector(breakers, ring))
	mc.Timeout = cfg.Timeout
	mc.MaxIdleConns = cfg.MaxIdleConns
	mc.DialContext = clientDialer(breakers, dial)
	s := &Store{
		mc:         mc,
		ring:       ring,
		keys:       keys,
		timeout:    cfg.Timeout,
		proxy:      cfg.Proxy,
		pool:       newPool(dial, cfg.Timeout, cfg.MaxIdleConns),
		jitter:     max(orDefault(cfg.Jitter, DefaultJitter), 0),
		maxRetries: orDefault(cfg.MaxRetries, DefaultMaxRetries),
		backoff:    orDefault(cfg.RetryBackoff, DefaultRetryBackoff),
		now:        time.Now,
		refunds:    pending.New(maxDetached),
	}
	s.pool.breakers = breakers
	if size := orDefault(cfg.CacheSize, DefaultCacheSize); size > 0 {
		s.cache = newItemCache(size)
	}
	if cfg.AutoDiscovery != "" {
		s.discovery.endpoint, s.discovery.dial = cfg.AutoDiscovery, dial
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		err := s.Refresh(ctx)
		cancel()
		if err != nil {
			return nil, err
		}
		if cfg.DiscoveryInterval >= 0 {
			s.startDiscovery(orDefault(cfg.DiscoveryInterval, DefaultDiscoveryInterval))
		}
	}
	return s, nil
}

// orDefault returns v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// dialer returns the DialContext for cfg: plain TCP, or TLS with the
// configured or derived ServerName.
func dialer(cfg Config) dialFunc {
	nd := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
	if cfg.TLS == nil && cfg.ServerName == "" {
		return nd.DialContext
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLS != nil {
		base = cfg.TLS.Clone()
	}
	if cfg.ServerName != "" {
		base.ServerName = cfg.ServerName
	}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		tc := base
		if tc.ServerName == "" {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				host = address
			}
			tc = base.Clone()
			tc.ServerName = host
		}
		d := &tls.Dialer{NetDialer: nd, Config: tc}
		return d.DialContext(ctx, network, address)
	}
}

// Client returns the gomemcache client the Store uses for buckets and logs:
// its nodes (the Store's [Ring], kept up to date by auto discovery), TLS
// dialer, timeout and pool. Hand it to [NewLeases] to keep leases and
// gauges on the same cluster and connections.
func (s *Store) Client() *memcache.Client { return s.mc }

// Nodes returns the nodes keys are spread over.
func (s *Store) Nodes() []string { return s.ring.Nodes() }

// Refresh asks the auto-discovery endpoint for the node list now and applies
// it if its version is newer than the one in use. It does nothing without
// AutoDiscovery.
func (s *Store) Refresh(ctx context.Context) error {
	if s.discovery.endpoint == "" {
		return nil
	}
	version, nodes, err := discover(ctx, s.discovery.dial, s.discovery.endpoint)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	s.discovery.mu.Lock()
	defer s.discovery.mu.Unlock()
	if version < s.discovery.version {
		return nil
	}
	before := s.ring.Nodes()
	if err := s.ring.SetNodes(nodes...); err != nil {
		return fmt.Errorf("%w: %w", ErrDiscovery, err)
	}
	s.discovery.version = version
	if after := s.ring.Nodes(); !slices.Equal(before, after) {
		// Forget idle connections to nodes that left.
		s.pool.retain(after)
		s.mc.Close()
	}
	return nil
}

func (s *Store) startDiscovery(every time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	s.discovery.stop, s.discovery.done = cancel, make(chan struct{})
	go func() {
		defer close(s.discovery.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c, cancel := context.WithTimeout(ctx, s.timeout)
				// A failed refresh keeps the current nodes; the next
				// tick tries again.
				_ = s.Refresh(c)
				cancel()
			}
		}
	}()
}

// Close stops auto discovery and closes idle connections. A closed Store
// still works (it dials again) but no longer refreshes its nodes.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.discovery.stop != nil {
			s.discovery.stop()
			<-s.discovery.done
		}
	})
	s.pool.close()
	return s.mc.Close()
}

// withDeadline bounds ctx by the per-call timeout.
func (s *Store) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// expiry is the memcached expiration of an item that must live at least
// ttl from now: expiration on the store's clock and jitter.
func (s *Store) expiry(ttl time.Duration) int32 { return expiration(s.now(), ttl, s.jitter) }

// expirySlack is what expiration adds to a TTL rounded up to whole
// seconds: 1 s for now.Unix()'s truncation, 1 s for memcached's clock (a
// whole-second tick read against its start time, which may run up to a
// second ahead of real time), and 2 s of clock skew, a client clock behind
// the server's (EC2 and Lambda hosts keep within milliseconds of each
// other with Amazon Time Sync).
const expirySlack = 4

// expiration converts a TTL to a memcached expiration, an absolute Unix
// time: now plus ttl rounded up to whole seconds, plus up to jitter, plus
// expirySlack. A time past what an int32 holds (2038) becomes 0, no
// expiry (the item then lives until evicted).
//
// Why absolute: memcached turns a relative expiration into a time on its
// own coarse clock, which a timer moves once a second. A server that has
// not run for a while (stopped, starved of CPU, a paused VM) resumes with
// that clock behind, and an item set before the timer catches up expires
// as soon as it does: after a 2.5 s SIGSTOP an item given 2 s was gone
// 3 ms later, so a window counter created in that moment vanished and its
// window admitted up to its limit again. memcached converts an absolute
// time from its start time instead, so the item lives until that time in
// real time whatever its clock's lag (TestExpiryAfterStall). The trade is
// clock skew: a client clock behind the server's by d shortens every
// item's life by d, which expirySlack covers up to 2 s; longer lives cost
// only memory (an item past its TTL is never read as in view).
func expiration(now time.Time, ttl, jitter time.Duration) int32 {
	if jitter > 0 {
		ttl += rand.N(jitter + 1)
	}
	if ttl < 0 { // overflow of a huge TTL plus jitter
		return 0
	}
	secs := int64(ttl / time.Second)
	if ttl%time.Second != 0 {
		secs++
	}
	abs := now.Unix() + secs + expirySlack
	if abs > math.MaxInt32 || abs < 0 {
		return 0
	}
	return int32(abs)
}

// call runs f in its own goroutine and waits for it or for ctx. A call
// abandoned on ctx finishes in the background within the socket timeout.
func call[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// retryDead runs f, and runs it once more if it failed because a pooled
// connection turned out to be dead (the server restarted or dropped it
// while idle). The idle pool is emptied first: its other connections are
// most likely dead too. Retrying a command that may have reached the server
// can only count a request twice, which makes the limiter stricter, never
// laxer.
func retryDead[T any](mc *memcache.Client, f func() (T, error)) (T, error) {
	v, err := f()
	if err != nil && deadConn(err) {
		mc.Close()
		v, err = f()
	}
	return v, err
}

// deadConn reports whether err says the connection was closed by the peer.
func deadConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, net.ErrClosed)
}

// errorf wraps a failure of op: a corrupt value as storage.ErrCorruptState,
// a lost race as storage.ErrConflict, anything else as ErrUnavailable.
func errorf(op string, err error) error {
	switch {
	case errors.Is(err, storage.ErrCorruptState), errors.Is(err, storage.ErrConflict):
		return fmt.Errorf("memcached: %s: %w", op, err)
	case isTimeout(err) && !errors.Is(err, context.DeadlineExceeded):
		// A socket timeout is the call's deadline too.
		return fmt.Errorf("memcached: %s: %w: %w: %w", op, ErrUnavailable, context.DeadlineExceeded, err)
	case isClientError(err):
		// The server refused to incr/decr: the item is not a number, so
		// it is not ours or was damaged.
		return fmt.Errorf("memcached: %s: %w: %w", op, storage.ErrCorruptState, err)
	}
	return fmt.Errorf("memcached: %s: %w: %w", op, ErrUnavailable, err)
}

// isTimeout reports a socket or dial timeout.
func isTimeout(err error) bool {
	var cte *memcache.ConnectTimeoutError
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &cte)
}

// isClientError reports a CLIENT_ERROR reply to incr or decr (gomemcache
// gives it only as text).
func isClientError(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "memcache: client error:")
}
