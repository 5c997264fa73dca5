// Package storage is the contract between Sluice's limiters (package
// limiter) and the stores that keep their state: the interfaces a backend
// implements, the steps it is handed, and the helpers it uses to answer
// them.
//
// A limiter turns each decision into one [Step] per limit and hands the
// steps of a request to its store's [Batcher] at once. A store that does
// not batch implements the single-step interfaces ([Counter],
// [PackedCounter], [BucketStore], [LogStore]) and is driven through the
// plain loop [Steps]. [Store] is a store of every kind a rule uses; the
// concurrency limiter and the load shedders need [LeaseStore] and
// [GaugeStore]; [Resetter], [LogReader], [LeaseKeeper], [CrossRegionWriter] and
// [Fencer] (with [BucketFencer]) are optional.
//
// The algorithms a store makes atomic live here, so that a store does no
// arithmetic of its own: [BucketOp.Apply], [LogOp.Apply], [LeaseOp.Apply]
// and the packed window's layout ([PackedPlan], [PackedTotal]). A store
// answers a decision with [Decision]: the limiter's decision without the
// limit's name, a type of its own so that this package does not import
// package limiter (which imports it). The errors a store wraps
// ([ErrUnavailable], [ErrThrottled], [ErrConflict], [ErrCorruptState],
// [ErrFenced]) tell the limiter how to treat a failure.
//
// backends/memory is the reference implementation and limiter/limitertest
// the conformance suite every store passes. docs/stores.md states what a
// store must do and how each backend does it; docs/consistency.md why that
// keeps the limits exact under concurrency and out-of-order arrivals.
package storage
