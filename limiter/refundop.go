package limiter

// Refund reports whether the op gives tokens back (a batch's refund round)
// rather than taking or reading. Like a [StepSub], a refund's answer is not
// needed by the caller: a [Batcher] may send it without waiting.
func (op BucketOp) Refund() bool { return op.mode == opRefund }

// Refund reports whether the op removes entries it recorded (a batch's
// refund round) rather than recording them. Like a [StepSub], a refund's
// answer is not needed by the caller: a [Batcher] may send it without
// waiting.
func (op LogOp) Refund() bool { return op.mode == opRefund }
