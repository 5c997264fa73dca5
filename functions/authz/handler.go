package authz

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// DefaultDeadline bounds one decision (every backend call of it), well
// inside API Gateway's authorizer timeout: config.DefaultDeadline, the one
// definition the construct reads too.
const DefaultDeadline = config.DefaultDeadline

// HTTP API response formats (Config.HTTPResponses), as config names them.
const (
	HTTPSimple = config.HTTPResponsesSimple // {isAuthorized, context}: enableSimpleResponses
	HTTPIAM    = config.HTTPResponsesIAM    // an IAM policy, as for REST APIs
)

// ShedError fails an invocation whose request is load-shed. API Gateway
// answers a Lambda authorizer's error other than "Unauthorized" with a
// gateway response (reported as AUTHORIZER_CONFIGURATION_ERROR, documented
// as AUTHORIZER_FAILURE), both of which the infra maps to 503.
type ShedError struct {
	// Rule is the first matching rule ("" when none matched); RetryAfter
	// the shedder's hint; Shedder the name of the shedder that shed
	// ("fleet" or "utilization" for the SLUICE_SHED_* shedders).
	Rule       string
	RetryAfter time.Duration
	Shedder    string
}

func (e *ShedError) Error() string { return "sluice: load shed, retry later" }

// Config configures a [Handler].
type Config struct {
	// Policy supplies the rules: a *policy.Policy, or a *policy.Cache for
	// a rules table. Required.
	Policy policy.Source
	// Deadline bounds one decision; zero means DefaultDeadline. The
	// invocation's own deadline applies too.
	Deadline time.Duration
	// Clock is the algorithms' time; nil means limiter.SystemClock.
	Clock limiter.Clock
	// Metrics receives one EMF line per rule checked; nil means none.
	Metrics *Metrics
	// Logger receives decisions (allow at debug, deny at info, backend
	// failures at warn) with keys hashed; nil means none.
	Logger *slog.Logger
	// HTTPResponses is HTTPSimple (the default) or HTTPIAM: the response
	// format for HTTP API payload 2.0 events, as configured on the
	// authorizer (enableSimpleResponses).
	HTTPResponses string
	// LogKey keys the HMAC that hashes keys in logs, so that log readers
	// cannot brute-force addresses from them. Nil means a random key per
	// process (hashes then only correlate within one instance).
	LogKey []byte
	// Authenticate, when not nil, is called before the rules; an error
	// makes the response the "Unauthorized" error (401).
	Authenticate func(ctx context.Context, ev *Event) error
	// ClientIP is where the client address ({ip}) comes from:
	// ClientIPSourceIP (the default) or ClientIPViewerAddress (behind the
	// CloudFront edge front door; needs EdgeSecret). See clientip.go.
	ClientIP string
	// EdgeSecret is the value of the EdgeSecretHeader that the CloudFront
	// distribution adds to its origin requests: with ClientIPViewerAddress,
	// only requests that carry it are keyed by CloudFront-Viewer-Address.
	EdgeSecret string
	// Scheduled, when not nil, runs on a scheduled event (an EventBridge
	// schedule's invocation: the regional shares' keeper), under the
	// invocation's context; its result is the invocation's. Nil: a
	// scheduled event gets ErrNoKeeper.
	Scheduled func(ctx context.Context, ev *events.CloudWatchEvent) (any, error)
}

// Handler is the authorizer. Safe for concurrent use.
type Handler struct {
	cfg          Config
	log          *slog.Logger
	warnedViewer atomic.Bool
}

// New returns a handler, or an error for an invalid Config.
func New(cfg Config) (*Handler, error) {
	if cfg.Policy == nil || cfg.Policy.Policy() == nil {
		return nil, errors.New("authz: Config.Policy is required")
	}
	if cfg.Deadline < 0 {
		return nil, fmt.Errorf("authz: Deadline %v is negative", cfg.Deadline)
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.Clock == nil {
		cfg.Clock = limiter.SystemClock
	}
	switch cfg.HTTPResponses {
	case "":
		cfg.HTTPResponses = HTTPSimple
	case HTTPSimple, HTTPIAM:
	default:
		return nil, fmt.Errorf("authz: HTTPResponses %q is not %s or %s", cfg.HTTPResponses, HTTPSimple, HTTPIAM)
	}
	if err := checkClientIP(&cfg); err != nil {
		return nil, err
	}
	if cfg.LogKey == nil {
		cfg.LogKey = make([]byte, 32)
		rand.Read(cfg.LogKey)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError + 1}))
	}
	return &Handler{cfg: cfg, log: log}, nil
}

// Handle is the Lambda handler: it decodes any of the three authorizer
// events and returns the response (a [Response]) for lambda.Start to
// marshal, or an error: [ErrUnauthorized], a [*ShedError] or an
// [*EventError]. A scheduled event runs Config.Scheduled and returns its
// result ([ErrNoKeeper] when it is nil).
func (h *Handler) Handle(ctx context.Context, event json.RawMessage) (any, error) {
	ev, err := h.decode(ctx, event)
	if err != nil {
		return nil, err
	}
	if ev.Kind == KindScheduled {
		return h.scheduled(ctx, ev)
	}
	r, _, err := h.decide(ctx, ev)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Invoke implements aws-lambda-go's lambda.Handler: it takes the raw
// payload and returns the marshalled response, so that the whole event,
// malformed JSON included, is the handler's to judge (lambda.Start would
// otherwise reject malformed JSON itself). functions/authorizer passes the
// Handler to lambda.Start. A scheduled event is Handle's.
func (h *Handler) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	ev, err := h.decode(ctx, payload)
	if err != nil {
		return nil, err
	}
	if ev.Kind == KindScheduled {
		out, err := h.scheduled(ctx, ev)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	}
	r, _, err := h.decide(ctx, ev)
	if err != nil {
		return nil, err
	}
	return r.AppendJSON(make([]byte, 0, 512)), nil
}

// Decide is Handle with the typed response and the policy's result (for the
// local API and tests). A scheduled event is not an authorizer event here.
func (h *Handler) Decide(ctx context.Context, event []byte) (Response, policy.Result, error) {
	ev, err := h.decode(ctx, event)
	if err != nil {
		return nil, policy.Result{}, err
	}
	if ev.Kind == KindScheduled {
		return nil, policy.Result{}, &EventError{Kind: KindScheduled, Reason: "not an authorizer event"}
	}
	return h.decide(ctx, ev)
}

// decode decodes an event, logging a bad one.
func (h *Handler) decode(ctx context.Context, event []byte) (*Event, error) {
	ev, err := DecodeEvent(event)
	if err != nil && !errors.Is(err, ErrUnauthorized) {
		h.log.LogAttrs(ctx, slog.LevelWarn, "bad event", slog.String("error", err.Error()))
	}
	return ev, err
}

// scheduled runs the keeper on a scheduled event.
func (h *Handler) scheduled(ctx context.Context, ev *Event) (any, error) {
	if h.cfg.Scheduled == nil {
		h.log.LogAttrs(ctx, slog.LevelWarn, "scheduled event without a keeper", slog.String("error", ErrNoKeeper.Error()))
		return nil, ErrNoKeeper
	}
	return h.cfg.Scheduled(ctx, ev.Scheduled)
}

// decide decides an authorizer event.
func (h *Handler) decide(ctx context.Context, ev *Event) (Response, policy.Result, error) {
	if h.cfg.ClientIP == ClientIPViewerAddress && h.viewerAddress(&ev.Request) && !h.warnedViewer.Swap(true) {
		h.log.LogAttrs(ctx, slog.LevelWarn, "a request through the edge carries no valid "+ViewerAddressHeader+
			" header: keyed by its source IP (the CloudFront server); add the header to the origin request policy (logged once)")
	}
	if h.cfg.Authenticate != nil {
		if err := h.cfg.Authenticate(ctx, ev); err != nil {
			h.log.LogAttrs(ctx, slog.LevelInfo, "unauthenticated", slog.String("kind", ev.Kind.String()), slog.String("error", h.redact(err.Error(), &ev.Request, "")))
			return nil, policy.Result{}, ErrUnauthorized
		}
	}
	now := h.cfg.Clock.Now()
	dctx, cancel := context.WithTimeout(ctx, h.cfg.Deadline)
	pol := h.cfg.Policy.Policy()
	res := pol.Evaluate(dctx, &ev.Request, now)
	cancel()
	h.cfg.Metrics.Record(now, &res, pol)
	h.logResult(ctx, ev, &res)

	switch res.Outcome {
	case policy.Unauthenticated:
		return nil, res, ErrUnauthorized
	case policy.Shed:
		return nil, res, &ShedError{Rule: res.Rule, RetryAfter: res.Decision.RetryAfter, Shedder: res.Decision.Name}
	}
	c := contextOf(&res)
	allow := res.Outcome == policy.Allow
	if ev.Kind == KindHTTP && h.cfg.HTTPResponses == HTTPSimple {
		return &SimpleResponse{IsAuthorized: allow, Context: c}, res, nil
	}
	return iamResponse(ev.ARN, allow, c), res, nil
}

// logResult logs one decision: backend failures at warn, denials and
// refusals at info, the rest at debug.
func (h *Handler) logResult(ctx context.Context, ev *Event, res *policy.Result) {
	h.logFailures(ctx, ev, res)
	h.logDecision(ctx, ev, res)
}

// logFailures logs the backends' and the shedder's errors (warn) and the
// shadow rules' would-be denials (info).
func (h *Handler) logFailures(ctx context.Context, ev *Event, res *policy.Result) {
	for i := range res.Evals {
		e := &res.Evals[i]
		if e.Err == nil || !h.log.Enabled(ctx, slog.LevelWarn) {
			continue
		}
		msg := "backend error"
		if e.Failed {
			msg = "backend failed, fail " + e.Fail.String()
		}
		h.log.LogAttrs(ctx, slog.LevelWarn, msg,
			slog.String("rule", e.Rule),
			slog.String("key", h.hashKey(e.Key)),
			slog.String("latency", e.Latency.String()),
			slog.String("error", h.redact(e.Err.Error(), &ev.Request, e.Key)))
	}
	if res.ShedErr != nil && h.log.Enabled(ctx, slog.LevelWarn) {
		msg := "shedder failed, fail open"
		if res.Outcome == policy.Shed {
			msg = "shedder error" // the shedder's decision stood (a stale utilization: receding)
		}
		h.log.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("priority", res.Priority.String()), slog.String("error", res.ShedErr.Error()))
	}
	for i := range res.Evals {
		e := &res.Evals[i]
		if e.ShadowDenied && h.log.Enabled(ctx, slog.LevelInfo) {
			h.log.LogAttrs(ctx, slog.LevelInfo, "would deny",
				slog.String("rule", e.Rule),
				slog.String("key", h.hashKey(e.Key)),
				slog.String("tier", e.Tier),
				slog.String("limit_name", e.Decision.Name),
				slog.Int64("limit", e.Decision.Limit),
				slog.String("retry_after", e.Decision.RetryAfter.String()),
				slog.String("kind", ev.Kind.String()))
		}
	}
}

// logDecision logs the decision: at info when it refused the request or
// an allow list let it through, else at debug.
func (h *Handler) logDecision(ctx context.Context, ev *Event, res *policy.Result) {
	level := slog.LevelDebug
	if res.Outcome != policy.Allow || res.Reason == policy.ReasonAllowList {
		level = slog.LevelInfo
	}
	if !h.log.Enabled(ctx, level) {
		return
	}
	key := ""
	for i := range res.Evals {
		if res.Evals[i].Rule == res.Rule {
			key = h.hashKey(res.Evals[i].Key)
		}
	}
	if res.Outcome == policy.Shed {
		h.log.LogAttrs(ctx, level, "decision",
			slog.String("decision", res.Outcome.String()),
			slog.String("reason", string(res.Reason)),
			slog.String("kind", ev.Kind.String()),
			slog.String("rule", res.Rule),
			slog.String("shedder", res.Decision.Name),
			slog.String("retry_after", res.Decision.RetryAfter.String()),
			slog.String("priority", res.Priority.String()),
			slog.Int("rules", len(res.Evals)))
		return
	}
	if res.List.List != "" {
		h.log.LogAttrs(ctx, level, "decision",
			slog.String("decision", res.Outcome.String()),
			slog.String("reason", string(res.Reason)),
			slog.String("kind", ev.Kind.String()),
			slog.String("list_match", res.List.By))
		return
	}
	tier := ""
	for i := range res.Evals {
		if res.Evals[i].Rule == res.Rule {
			tier = res.Evals[i].Tier
		}
	}
	h.log.LogAttrs(ctx, level, "decision",
		slog.String("decision", res.Outcome.String()),
		slog.String("reason", string(res.Reason)),
		slog.String("kind", ev.Kind.String()),
		slog.String("rule", res.Rule),
		slog.String("tier", tier),
		slog.String("limit_name", res.Decision.Name),
		slog.Int("leases", len(res.Leases)),
		slog.String("key", key),
		slog.Int64("limit", res.Decision.Limit),
		slog.Int64("remaining", res.Decision.Remaining),
		slog.String("retry_after", res.Decision.RetryAfter.String()),
		slog.String("priority", res.Priority.String()),
		slog.Int("rules", len(res.Evals)))
}

// hashKey is what logs show of a key: 64 bits of HMAC-SHA256 under LogKey.
func (h *Handler) hashKey(key string) string {
	if key == "" {
		return ""
	}
	m := hmac.New(sha256.New, h.cfg.LogKey)
	io.WriteString(m, key)
	var sum [sha256.Size]byte
	return hex.EncodeToString(m.Sum(sum[:0])[:8])
}

// redact removes the request's identifying values (and its rendered key)
// from an error message before it is logged: a backend error may quote a
// key.
func (h *Handler) redact(msg string, req *policy.Request, key string) string {
	for _, v := range []string{key, req.SourceIP, req.APIKey, req.Token} {
		if len(v) >= 4 {
			msg = strings.ReplaceAll(msg, v, "[redacted]")
		}
	}
	return msg
}
