package memcached

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
)

const (
	// maxKeyLen is memcached's key limit.
	maxKeyLen = 250
	// maxSuffixLen is the longest suffix added to a base key: "|c" and a
	// sub-window index ("-9223372036854775808" is 20 bytes).
	maxSuffixLen = 22
	// maxPackedSuffixLen is the longest suffix of a packed window's
	// counter: "|p", a level digit, ':' and an index.
	maxPackedSuffixLen = 4 + 20
	// hashedBaseLen is the length of a hashed base without the prefix:
	// "h:" and 43 bytes of unpadded base64url SHA-256.
	hashedBaseLen = 2 + 43
	// MaxKeyPrefix is the longest Config.KeyPrefix accepted.
	MaxKeyPrefix = 100
	// tagSep separates a base key from its suffix. The ring places an item
	// by the part of its key before the last tagSep, so every item of one
	// limiter key lives on one node.
	tagSep = '|'
)

// keyer turns limiter keys into memcached keys.
//
// A key whose Space and Name are printable ASCII (0x21-0x7e), whose Space
// has no '/', and which fits, is stored readably as
//
//	prefix "k:" Space "/" Name
//
// Anything else is stored as
//
//	prefix "h:" base64url(SHA-256(uvarint(len(Space)) Space Name))
//
// The two forms cannot collide (they differ after the prefix); the readable
// form is injective because Space has no '/'; the hashed form is injective
// as long as SHA-256 is collision resistant, since its input encoding is.
// A suffix names the item: "|c<idx>" for a window's sub-window counter,
// "|b" for a token bucket, "|l" for a sliding log, "|p<level>:<idx>" for a
// packed window's counter (whose base is computed with room for that
// longer suffix: packedBase). Suffixes never contain
// '|', so base and suffix are recovered by splitting at the last '|'.
type keyer struct {
	prefix string
	// known caches packed windows' bases and the counters known to exist
	// (nil: no cache).
	known *knownCache
}

func newKeyer(prefix string) (keyer, error) {
	if len(prefix) > MaxKeyPrefix {
		return keyer{}, fmt.Errorf("%w: memcached: key prefix is %d bytes, at most %d allowed", limiter.ErrInvalidConfig, len(prefix), MaxKeyPrefix)
	}
	if !printable(prefix) {
		return keyer{}, fmt.Errorf("%w: memcached: key prefix %q must be printable ASCII without spaces", limiter.ErrInvalidConfig, prefix)
	}
	return keyer{prefix: prefix, known: newKnownCache()}, nil
}

// printable reports whether s is only bytes 0x21-0x7e.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// base returns the memcached key of k without a suffix.
func (kr keyer) base(k storage.Key) string { return kr.baseFor(k, maxSuffixLen) }

// packedBase returns the base of a packed window's counters: readable
// only if a packed suffix fits after it too. (A packed window's Space is
// its own, so its base never needs to match another item's.)
func (kr keyer) packedBase(k storage.Key) string {
	base, _ := kr.packedKnown(k)
	return base
}

// packedKnown returns packedBase(k) and the counters of k's packed window
// known to exist, from the cache when k is in it (no allocation).
func (kr keyer) packedKnown(k storage.Key) (string, [storage.PackedLevels]knownCounter) {
	return kr.knownFor(k, maxPackedSuffixLen)
}

// windowKnown returns base(k) and the counter of k's window known to
// exist (a window's counters are written one at a time, so one is
// remembered: the current sub-window's), from the cache when k is in it.
func (kr keyer) windowKnown(k storage.Key) (string, knownCounter) {
	base, lv := kr.knownFor(k, maxSuffixLen)
	return base, lv[0]
}

// knownFor returns k's base for suffixes of at most suffix bytes, and what
// the cache knows of k's counters. A key's Space names its kind (packed
// or not), so one key is only ever asked for with one suffix length.
func (kr keyer) knownFor(k storage.Key, suffix int) (string, [storage.PackedLevels]knownCounter) {
	c := kr.known
	if c == nil || len(k.Space)+len(k.Name) > knownMaxKey {
		return kr.baseFor(k, suffix), [storage.PackedLevels]knownCounter{}
	}
	sh := c.shard(k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	sh.mu.Unlock()
	if ok {
		return e.base, e.lv
	}
	base := kr.baseFor(k, suffix)
	sh.mu.Lock()
	if _, ok := sh.m[k]; !ok {
		sh.makeRoom()
		sh.m[k] = knownEntry{base: base}
	}
	sh.mu.Unlock()
	return base, [storage.PackedLevels]knownCounter{}
}

// baseFor returns the memcached key of k without a suffix of at most
// suffix bytes.
func (kr keyer) baseFor(k storage.Key, suffix int) string {
	if len(kr.prefix)+2+len(k.Space)+1+len(k.Name)+suffix <= maxKeyLen &&
		printable(k.Space) && printable(k.Name) && !strings.Contains(k.Space, "/") {
		return kr.prefix + "k:" + k.Space + "/" + k.Name
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(k.Space)))])
	h.Write([]byte(k.Space))
	h.Write([]byte(k.Name))
	var sum [sha256.Size]byte
	return kr.prefix + "h:" + base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0]))
}

// counter returns the key of sub-window idx of base.
func counterKey(base string, idx int64) string {
	b := make([]byte, 0, len(base)+maxSuffixLen)
	b = append(b, base...)
	b = append(b, tagSep, 'c')
	return string(strconv.AppendInt(b, idx, 10))
}

// appendPackedKey appends the key of a packed window's counter c of base.
func appendPackedKey(b []byte, base string, c storage.PackedCell) []byte {
	b = append(b, base...)
	b = append(b, tagSep, 'p', '0'+c.Level, ':')
	return strconv.AppendInt(b, c.Index, 10)
}

func bucketKey(base string) string { return base + "|b" }

func logKey(base string) string { return base + "|l" }

// The known-counter cache: per Store, at most knownShards*knownPerShard
// limiter keys (each with its packed base, at most maxKeyLen bytes, and
// its Space and Name, at most knownMaxKey bytes: a few MB at worst).
const (
	knownShards   = 64
	knownPerShard = 512
	// knownMaxKey is the longest Space+Name cached; longer keys compute
	// their base per call and always send their adds.
	knownMaxKey = 256
)

// knownCache remembers, per limiter key, its base and, per level of a
// packed window (a window's counter uses the first), the one counter this
// Store has seen exist with the time until which it
// must still exist: the level's TTL from the moment before the round
// whose add created it (STORED). memcached keeps an item at least that
// long (Store.expiry adds a second and more), unless it evicts it early
// or is flushed: an incr then answers NOT_FOUND, and packedAdd (window)
// sends that level (counter) again with its add and forgets the counter. A counter whose add
// answered NOT_STORED exists, but since when is unknown: it is not
// recorded, and its add is sent each time.
type knownCache struct {
	seed   maphash.Seed
	shards [knownShards]knownShard
}

type knownShard struct {
	mu sync.Mutex
	m  map[storage.Key]knownEntry
	_  [64 - 16]byte // one shard per cache line
}

type knownEntry struct {
	base string
	lv   [storage.PackedLevels]knownCounter
}

// knownCounter is a level's counter known to exist: its index, and the
// knownNow until which it does (0: none known).
type knownCounter struct {
	idx   int64
	until int64
}

// has reports whether it knows c to exist at now.
func (kc knownCounter) has(c storage.PackedCell, now int64) bool {
	return kc.hasIdx(c.Index, now)
}

// hasIdx reports whether it knows the counter of index idx to exist at now.
func (kc knownCounter) hasIdx(idx, now int64) bool {
	return kc.until > now && kc.idx == idx
}

func newKnownCache() *knownCache {
	c := &knownCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[storage.Key]knownEntry)
	}
	return c
}

var knownEpoch = time.Now()

// knownNow is the monotonic clock of knownCounter.until, in nanoseconds.
func knownNow() int64 { return int64(time.Since(knownEpoch)) }

func (c *knownCache) shard(k storage.Key) *knownShard {
	return &c.shards[maphash.Comparable(c.seed, k)%knownShards]
}

// makeRoom drops an entry (the first the map's randomized iteration
// yields) when the shard is full. The caller holds sh.mu.
func (sh *knownShard) makeRoom() {
	if len(sh.m) < knownPerShard {
		return
	}
	for k := range sh.m {
		delete(sh.m, k)
		return
	}
}

// record sets the levels of set to lv's counters and forgets those of
// drop whose index is lv's.
func (kr keyer) record(k storage.Key, base string, set, drop uint8, lv *[storage.PackedLevels]knownCounter) {
	c := kr.known
	if c == nil || len(k.Space)+len(k.Name) > knownMaxKey {
		return
	}
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok {
		if set == 0 {
			return
		}
		sh.makeRoom()
		e.base = base
	}
	for l := range storage.PackedLevels {
		if set&(1<<l) != 0 {
			e.lv[l] = lv[l]
		} else if drop&(1<<l) != 0 && e.lv[l].idx == lv[l].idx {
			e.lv[l] = knownCounter{}
		}
	}
	sh.m[k] = e
}
