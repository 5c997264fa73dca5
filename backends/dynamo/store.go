package dynamo

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/internal/pending"
	"github.com/sluicehq/sluice/limiter/storage"
)

// Client is the part of the DynamoDB API the store uses. *dynamodb.Client
// satisfies it; tests may wrap it.
type Client interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

var _ Client = (*dynamodb.Client)(nil)

var (
	_ storage.Counter     = (*Store)(nil)
	_ storage.BucketStore = (*Store)(nil)
	_ storage.LogStore    = (*Store)(nil)
)

// Attribute names of the table layout (see the package documentation).
const (
	// AttrPK is the partition key (String).
	AttrPK = "pk"
	// AttrTTL is the expiry time in Unix seconds (Number), the table's TTL
	// attribute.
	AttrTTL = "ttl"

	attrLog     = "l"
	attrVersion = "v"
)

// ItemBudget is the largest item the store writes, in bytes as DynamoDB
// counts them (attribute names plus values): one write capacity unit.
const ItemBudget = 1024

// Defaults used when the corresponding Config field is zero.
const (
	DefaultTimeout     = time.Second
	DefaultMaxAttempts = 32
	DefaultCacheSize   = 10_000
	DefaultBackoffBase = time.Millisecond
	DefaultBackoffMax  = 50 * time.Millisecond
)

var (
	// ErrThrottled is wrapped when DynamoDB throttled the request
	// (ProvisionedThroughputExceededException, ThrottlingException,
	// RequestLimitExceeded, or a generic throttling code; see the package
	// documentation) and the SDK's retries within the deadline did not get
	// through.
	ErrThrottled = fmt.Errorf("dynamo: throttled: %w", storage.ErrThrottled)
	// ErrUnavailable is wrapped by every other error of a DynamoDB
	// request: it could not be reached or did not answer within the
	// deadline (network errors, timeouts, 5xx), or did not carry the
	// request out (a missing table, refused credentials or permissions).
	ErrUnavailable = fmt.Errorf("dynamo: unavailable: %w", storage.ErrUnavailable)
	// ErrItemTooLarge is wrapped when a write would make an item larger
	// than ItemBudget (a sliding log with too many entries).
	ErrItemTooLarge = errors.New("dynamo: item would exceed 1 KB")
)

// Config configures a [Store]. Table is required; the other fields have
// defaults.
type Config struct {
	// Table is the table name. Its layout is described in the package
	// documentation; [CreateTable] creates it.
	Table string
	// Timeout bounds every store call (all its requests and retries) whose
	// context has no deadline; a caller's deadline is used as it is. Zero
	// means DefaultTimeout; negative means no bound.
	Timeout time.Duration
	// MaxAttempts bounds the conditional writes of one call that may lose a
	// race before the call gives up with an error wrapping
	// storage.ErrConflict. Zero means DefaultMaxAttempts.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the jittered pause between lost
	// races, from the second retry on (the first retry is immediate: it
	// starts from the state the failed write returned). Zero means the
	// defaults.
	BackoffBase, BackoffMax time.Duration
	// CacheSize bounds the number of keys whose last seen state is kept in
	// process. Zero means DefaultCacheSize; negative disables the cache
	// (every bucket and log decision then starts from a guess or a read).
	CacheSize int
	// Retryer is the SDK retryer used for every request (it replaces the
	// client's own for this store's calls). Nil means [NewRetryer] with its
	// defaults.
	Retryer aws.Retryer
	// Clock is the wall clock used for the TTL attribute (not for the
	// algorithms, which get their time from the caller). Nil means
	// time.Now.
	Clock func() time.Time
	// WaitRefunds makes [Store.Do] wait for the refunds of a batch (window
	// Subs, bucket and log refunds) like its other steps. By default they
	// are sent without waiting (see Do and the package documentation).
	WaitRefunds bool
	// MaxDetached bounds the refunds in flight without a waiter; a refund
	// over the bound is waited for. Zero means DefaultMaxDetached.
	MaxDetached int
	// CrossRegion says that the table is a global table in multi-Region
	// strong consistency (MRSC): every write is a quorum of Regions. The
	// store then says its writes cross regions
	// ([storage.CrossRegionWriter]), and limiter sizes a key's capacity
	// leases by its measured store round trip as well as its rate
	// (docs/leases.md). Off for a regional table and a default-mode
	// (eventually consistent) global table, whose writes are answered in
	// the Region.
	CrossRegion bool
}

// Store keeps limiter state in one DynamoDB table. It implements
// [storage.BucketStore], [storage.Counter], [storage.PackedCounter] and
// [storage.LogStore] with the protocol described in the package
// documentation. It is safe for
// concurrent use; create it with [New] once per process and reuse it (it
// remembers the last state it saw per key).
type Store struct {
	client  Client
	table   *string
	cfg     Config
	cache   *cache
	optFns  []func(*dynamodb.Options)
	counter struct {
		conflicts, reads, cleanups, moves, lostRefunds, packedStale atomic.Int64
		settlements, settlesLost                                    atomic.Int64
	}
	// refunds: the refunds Do sends without waiting (batch.go).
	refunds *pending.Refunds
	// exactOnly turns off relative bucket writes (tests and benchmarks
	// compare the two protocols).
	exactOnly bool
	// packedEarly and packedNoStale break the packed protocol on purpose
	// (tests show that they fail without it): remove counters packedEarly
	// slots before the keep bound; never answer Stale.
	packedEarly   int64
	packedNoStale bool
	// brokenMerged drops a bucket's condition from the writes that merge
	// it with other parts (tests show the history checker fails it).
	brokenMerged bool
	// brokenRefundC lowers tat without c in a refund on a lease ring;
	// brokenRefundRoom drops its room conditions, on tat and on s
	// (tests show they fail).
	brokenRefundC, brokenRefundRoom bool
	// brokenFence drops a fenced add's or bucket take's condition on the
	// fence (tests show they fail such a store).
	brokenFence bool
	// prefixes are the attribute prefixes of the spaces served (item.go).
	prefixes prefixes
	// longestTTL is the longest ttl any limit asked of the store (ns).
	longestTTL atomic.Int64
}

// WritesCrossRegions implements [storage.CrossRegionWriter]:
// Config.CrossRegion.
func (s *Store) WritesCrossRegions() bool { return s.cfg.CrossRegion }

// New returns a store on client, or an error naming the bad Config field.
func New(client Client, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults(client)
	if err != nil {
		return nil, err
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.MaxDetached < 0 {
		return nil, fmt.Errorf("dynamo: Config.MaxDetached must not be negative, got %d", cfg.MaxDetached)
	}
	if cfg.MaxDetached == 0 {
		cfg.MaxDetached = DefaultMaxDetached
	}
	s := &Store{client: client, table: aws.String(cfg.Table), cfg: cfg, cache: newCache(cfg.CacheSize),
		refunds: pending.New(cfg.MaxDetached)}
	retryer := cfg.Retryer
	s.optFns = []func(*dynamodb.Options){func(o *dynamodb.Options) { o.Retryer = retryer }}
	return s, nil
}

// Stats are counters of a store's work, for tests, benchmarks and metrics.
type Stats struct {
	// Conflicts counts conditional writes that failed because another
	// writer got there first (or the cached state was stale).
	Conflicts int64
	// Reads counts consistent reads (confirming a denial or a Get made on a
	// cached state, or a read-only window query).
	Reads int64
	// Cleanups counts extra requests that removed stale sub-window
	// attributes from a window item.
	Cleanups int64
	// Moves counts window adds from past the horizon moved into it with a
	// second request (a writer's clock more than a window behind the
	// newest writer's).
	Moves int64
	// LostRefunds counts refunds sent without waiting (see [Store.Do])
	// that failed, and packed adds answered Stale whose undo failed: their
	// units stay counted.
	LostRefunds int64
	// PackedStale counts packed adds answered Stale (a writer past the
	// horizon, see [Store.AddPacked]): each took its add back with a
	// second UpdateItem.
	PackedStale int64
	// CachedKeys is the number of keys in the state cache.
	CachedKeys int
	// Settlements counts the writes that settled a leasing bucket's
	// unsettled consumption into its tat, SettlesLost those that failed
	// (the bucket's regime changed before they landed; the next write's
	// answer sends another).
	Settlements, SettlesLost int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Conflicts:   s.counter.conflicts.Load(),
		Reads:       s.counter.reads.Load(),
		Cleanups:    s.counter.cleanups.Load(),
		Moves:       s.counter.moves.Load(),
		LostRefunds: s.counter.lostRefunds.Load(),
		PackedStale: s.counter.packedStale.Load(),
		Settlements: s.counter.settlements.Load(),
		SettlesLost: s.counter.settlesLost.Load(),
		CachedKeys:  s.cache.len(),
	}
}

// ForgetCache drops every remembered state (as a cold Lambda would start).
func (s *Store) ForgetCache() { s.cache.clear() }

// withDeadline gives ctx the store's timeout when it has no deadline.
func (s *Store) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || s.cfg.Timeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

// ttlValue is the TTL attribute for state that must live ttl from now.
// It is rounded up to the next whole second, plus one second of slack for
// clock differences between hosts.
func (s *Store) ttlValue(ttl time.Duration) types.AttributeValue {
	now := s.cfg.Clock()
	exp := now.Add(ttl)
	if ttl < 0 || exp.Before(now) { // overflow
		exp = now.Add(100 * 365 * 24 * time.Hour)
	}
	sec := exp.Unix() + 1
	if exp.Nanosecond() > 0 {
		sec++
	}
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(sec, 10)}
}

// maxKeyBytes bounds the partition key value, which counts towards every
// item's size.
const maxKeyBytes = 160

// itemKey is the partition key of the item of k.Name, which holds the state
// of every limit whose key has that Name (k.Space picks the attributes, see
// item.go): "#/" and the Name escaped (printable ASCII other than '%', '/'
// and '#' is kept, every other byte is %XX). A key that would be longer
// than maxKeyBytes is "#/#" and the SHA-256 of the Name in base64url. The
// mapping is injective up to hash collisions (an escaped Name never holds a
// raw '#').
func itemKey(k storage.Key) string {
	b := make([]byte, 0, len(k.Name)+8)
	b = append(b, "#/"...)
	b = appendEscaped(b, k.Name)
	if len(b) <= maxKeyBytes {
		return string(b)
	}
	sum := sha256.Sum256([]byte(k.Name))
	b = append(b[:2], '#')
	return string(base64.RawURLEncoding.AppendEncode(b, sum[:]))
}

// attrsOf is the item key and attribute prefix of k.
func (s *Store) attrsOf(k storage.Key) (attrs, error) {
	pk := itemKey(k)
	pre, err := s.prefixes.prefix(pk, k.Space)
	if err != nil {
		return attrs{}, err
	}
	return attrs{pk: pk, pre: pre}, nil
}

func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c > ' ' && c < 0x7f && c != '%' && c != '/' && c != '#' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	return b
}

func keyAttr(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: pk}}
}

func numAttr(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// numberSize is the size DynamoDB counts for a number: one byte per two
// significant digits, plus one.
func numberSize(v int64) int {
	s := strconv.FormatInt(v, 10)
	digits := 0
	for i := 0; i < len(s); i++ {
		if s[i] >= '0' && s[i] <= '9' {
			digits++
		}
	}
	return (digits+1)/2 + 1
}

// corrupt returns an error wrapping storage.ErrCorruptState about attribute
// name of the item pk.
func corrupt(kind, pk, name, format string, args ...any) error {
	return fmt.Errorf("%w: dynamo: %s item %q: attribute %q: %s", storage.ErrCorruptState, kind, pk, name, fmt.Sprintf(format, args...))
}

// getInt reads a Number attribute that must be present.
func getInt(kind, pk string, item map[string]types.AttributeValue, name string) (int64, error) {
	av, ok := item[name]
	if !ok {
		return 0, corrupt(kind, pk, name, "missing")
	}
	n, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, corrupt(kind, pk, name, "want a Number, got %s", typeName(av))
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return 0, corrupt(kind, pk, name, "not an int64: %q", n.Value)
	}
	return v, nil
}

func typeName(av types.AttributeValue) string {
	switch av.(type) {
	case *types.AttributeValueMemberS:
		return "a String"
	case *types.AttributeValueMemberN:
		return "a Number"
	case *types.AttributeValueMemberB:
		return "a Binary"
	case *types.AttributeValueMemberBOOL:
		return "a Boolean"
	case *types.AttributeValueMemberNULL:
		return "NULL"
	case *types.AttributeValueMemberL:
		return "a List"
	case *types.AttributeValueMemberM:
		return "a Map"
	case *types.AttributeValueMemberSS, *types.AttributeValueMemberNS, *types.AttributeValueMemberBS:
		return "a Set"
	}
	return fmt.Sprintf("%T", av)
}

// withDefaults checks what New and NewLeases share of cfg and fills in the
// defaults.
func (cfg Config) withDefaults(client Client) (Config, error) {
	switch {
	case client == nil:
		return cfg, errors.New("dynamo: client must not be nil")
	case cfg.Table == "":
		return cfg, errors.New("dynamo: Config.Table must not be empty")
	case cfg.MaxAttempts < 0:
		return cfg, fmt.Errorf("dynamo: Config.MaxAttempts must not be negative, got %d", cfg.MaxAttempts)
	case cfg.BackoffBase < 0 || cfg.BackoffMax < 0:
		return cfg, errors.New("dynamo: Config.BackoffBase and BackoffMax must not be negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.Retryer == nil {
		cfg.Retryer = NewRetryer(RetryerConfig{})
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return cfg, nil
}
