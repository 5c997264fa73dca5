package memcached

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/limiter"
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
}

func newKeyer(prefix string) (keyer, error) {
	if len(prefix) > MaxKeyPrefix {
		return keyer{}, fmt.Errorf("%w: memcached: key prefix is %d bytes, at most %d allowed", limiter.ErrInvalidConfig, len(prefix), MaxKeyPrefix)
	}
	if !printable(prefix) {
		return keyer{}, fmt.Errorf("%w: memcached: key prefix %q must be printable ASCII without spaces", limiter.ErrInvalidConfig, prefix)
	}
	return keyer{prefix: prefix}, nil
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
func (kr keyer) base(k limiter.Key) string { return kr.baseFor(k, maxSuffixLen) }

// packedBase returns the base of a packed window's counters: readable
// only if a packed suffix fits after it too. (A packed window's Space is
// its own, so its base never needs to match another item's.)
func (kr keyer) packedBase(k limiter.Key) string { return kr.baseFor(k, maxPackedSuffixLen) }

// baseFor returns the memcached key of k without a suffix of at most
// suffix bytes.
func (kr keyer) baseFor(k limiter.Key, suffix int) string {
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
func appendPackedKey(b []byte, base string, c limiter.PackedCell) []byte {
	b = append(b, base...)
	b = append(b, tagSep, 'p', '0'+c.Level, ':')
	return strconv.AppendInt(b, c.Index, 10)
}

func bucketKey(base string) string { return base + "|b" }

func logKey(base string) string { return base + "|l" }
