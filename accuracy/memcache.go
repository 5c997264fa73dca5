package accuracy

import "strconv"

// Memcached item sizes, from memcached 1.6 (memcached.h, items.c, slabs.c):
//
//   - An item is a 48-byte header (struct _stritem on 64-bit: three
//     pointers, three 4-byte fields, two 2-byte fields, two 1-byte fields,
//     padded to 8), then 8 bytes of CAS id (CAS is on unless memcached runs
//     with -C), then the key and a NUL, then the client flags (4 bytes, only
//     when non-zero: Sluice's items have none), then the value and "\r\n".
//   - The item is stored in a chunk of the smallest slab class that holds
//     it. With the default -n 48 and -f 1.25 the classes are 96, 120, 152,
//     192, 240, 304, ... bytes: each 1.25 times the last, rounded up to 8.
//   - An incr that makes a number longer than the stored value copies it to
//     a new item; a shorter result is padded with spaces in place. A counter
//     item thus holds as many digits as the largest value it reached.
//
// The test TestItemSizeAgainstMemcached checks these against a real
// memcached when one is available (`make test`).
const (
	itemHeader   = 48
	itemCAS      = 8
	slabMinChunk = itemHeader + 48 // sizeof(item) + settings.chunk_size
	slabFactor   = 1.25
	slabMaxChunk = 512 * 1024 // settings.slab_chunk_size_max: half the 1 MB page
)

// itemBytes is the size of an item before rounding to a slab class.
func itemBytes(keyLen, valueLen int) int {
	return itemHeader + itemCAS + keyLen + 1 + valueLen + 2
}

// slabClasses are the chunk sizes of memcached's slab classes, computed as
// slabs_init does: from the smallest chunk, each class 1.25 times the last
// (truncated), rounded up to 8, until the next would reach a 1.25th of the
// largest chunk; the last class is the largest chunk itself.
var slabClasses = func() []int {
	var cs []int
	for size := slabMinChunk; float64(size) < slabMaxChunk/slabFactor; size = int(float64(size) * slabFactor) {
		if size%8 != 0 {
			size += 8 - size%8
		}
		cs = append(cs, size)
	}
	return append(cs, slabMaxChunk)
}()

// slabChunk returns the chunk size of the slab class that stores an item of
// n bytes (n itself above the largest class, where memcached chains
// chunks).
func slabChunk(n int) int {
	for _, c := range slabClasses {
		if n <= c {
			return c
		}
	}
	return n
}

// ItemSize is the memory memcached 1.6 uses for one item with a key and a
// value of these lengths.
func ItemSize(keyLen, valueLen int) int { return slabChunk(itemBytes(keyLen, valueLen)) }

// digits is the length of n in decimal.
func digits(n int64) int { return len(strconv.FormatInt(n, 10)) }

// Footprint is what a configuration keeps in memcached for one key.
type Footprint struct {
	// Items is the number of items a decision reads or writes: the
	// sub-window counters in view for the windows.
	Items int
	// KeyLen and ValueLen are the longest key and value seen (the key as
	// backends/memcached builds it, without a KeyPrefix).
	KeyLen, ValueLen int
	// Bytes is Items times the slab chunk of one item.
	Bytes int
}
