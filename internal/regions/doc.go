// Package regions keeps one limit across the regions of an eventually
// consistent (default-mode) DynamoDB global table as regional shares: a
// prototype, measured on the local harness (internal/testserver) and
// described in docs/regions.md.
//
// Each region decides its callers against its own share of the limit, a
// sliding window on a key only that region writes, so its conditional
// writes are exact. Shares move by grants: a region with more than its
// demand calls for gives units to regions short of theirs, and publishes
// the running totals it gave in a ledger item only it writes. A grant
// lowers the giver's share at once and raises the receiver's only when the
// receiver has read it (a lag later), and every share a region used in the
// last window keeps bounding it, so the shares in force over any window of
// stamps never sum above the limit, whatever the replication lag.
package regions
