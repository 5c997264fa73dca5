// Package regions keeps one key's limit (a sliding window or a token
// bucket) across the regions of an eventually consistent (default-mode)
// DynamoDB global table as regional shares: a prototype, measured on the
// local harness (internal/testserver) and described in docs/regions.md
// ("Default mode with regional shares").
//
// Each region decides its callers against its own share, on an item only
// that region writes, so its conditional writes are exact. Shares move
// by grants: a region with more than its demand calls for gives units to
// regions short of theirs, and publishes the running totals it gave in a
// ledger item only it writes. A grant leaves the giver before it is
// published (a window's giver gives only what its count in view leaves
// free; a bucket's giver moves to a smaller bucket first) and reaches the
// receiver when it reads it, a replication lag later, so the shares in
// force never sum above the limit, whatever the lag, and a receiver uses
// a grant as soon as it reads it.
//
// An [Agent] from [NewAgent] reaches its region's processes ([Limiter])
// in memory; one from [NewTableAgent] reaches them ([Process]) only
// through the region's item in the table, and any number of them may run
// a region, one holding the role at a time. [Keys] runs them per key in a
// process; a region short of a key lists it in a wants index, and the
// other regions tick their agents of the keys listed there
// ([Keys.Sweep], in line with decisions or from a [Keeper]).
package regions
