package memcached

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter/storage"
)

// FuzzKeys: every limiter key becomes a legal memcached key (for every
// suffix), and two different limiter keys never share one.
func FuzzKeys(f *testing.F) {
	for _, n := range hostileNames() {
		f.Add("sw:10:1m0s:10", n, "tb:1:1h0m0s:1", n+"x")
	}
	f.Add("a/b", "c", "a", "b/c")
	f.Add("ab", "\x00", "a", "b\x00")
	kr, err := newKeyer("fz:")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, space1, name1, space2, name2 string) {
		k1, k2 := storage.Key{Space: space1, Name: name1}, storage.Key{Space: space2, Name: name2}
		b1, b2 := kr.base(k1), kr.base(k2)
		p1, p2 := kr.packedBase(k1), kr.packedBase(k2)
		for _, key := range []string{bucketKey(b1), logKey(b1), counterKey(b1, -1<<63), counterKey(b1, 1<<63-1),
			string(appendPackedKey(nil, p1, storage.PackedCell{Level: 1, Index: -1 << 63})),
			string(appendPackedKey(nil, p1, storage.PackedCell{Level: storage.PackedLevels, Index: 1<<63 - 1}))} {
			if !legal(key) {
				t.Fatalf("key %q: memcached key %q is not legal", k1, key)
			}
		}
		if (b1 == b2) != (k1 == k2) || (p1 == p2) != (k1 == k2) {
			t.Fatalf("keys %q and %q: memcached keys %q and %q, packed %q and %q", k1, k2, b1, b2, p1, p2)
		}
		// A packed counter's key parses back to its cell, on its base.
		c := storage.PackedCell{Level: 3, Index: int64(len(name1)) - 7}
		if got, ok := parsePackedSuffix(appendPackedKey(nil, p1, c), p1); !ok || got != c {
			t.Fatalf("packed key of %v on %q parses as %v, %v", c, p1, got, ok)
		}
		if i := strings.LastIndexByte(string(appendPackedKey(nil, p1, c)), tagSep); string(appendPackedKey(nil, p1, c))[:i] != p1 {
			t.Fatalf("hash tag of a packed key is not its base %q", p1)
		}
		// Nodes are picked by the base, whatever suffix follows.
		if i := strings.LastIndexByte(counterKey(b1, 7), tagSep); counterKey(b1, 7)[:i] != b1 {
			t.Fatalf("hash tag of %q is not its base %q", counterKey(b1, 7), b1)
		}
	})
}

// FuzzReplies: server replies never panic the parsers.
func FuzzReplies(f *testing.F) {
	f.Add([]byte("12\nh|10.0.0.1|11211 |10.0.0.2|11212\n"))
	f.Add([]byte("VALUE k|c1 0 1\r\n"))
	f.Add([]byte("VALUE k|c1 0 1 99\r\n"))
	f.Add([]byte("18446744073709551615\r\n"))
	f.Add([]byte("k:swp:1/a|p4:-12"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseUintLine(b)
		parseUcount(b)
		parsePackedSuffix(b, "k:swp:1/a")
		parseClusterConfig(b)
		parseValueLine(b)
		parseNumberLine(b)
		parseCount(b)
		decodeBucket(b)
		if _, _, ok := parseValueLine(b); ok && !bytes.HasPrefix(b, []byte("VALUE ")) {
			t.Fatalf("accepted %q", b)
		}
	})
}
