package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/backends/dynamo"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/functions/wiring"
	"github.com/sluicehq/sluice/internal/regions"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storage"
	"github.com/sluicehq/sluice/policy"
)

// errShares: the rule's limits are kept as regional shares (a global rule
// on an eventual table), which the command does not reset.
var errShares = errors.New("kept as regional shares")

// refuseShares is reset of a global rule on an eventual table
// (docs/operator.md, "A global rule"): the authorizer decides such a rule
// not on its plain key but on each region's own items, against the
// region's share (internal/regions). Removing a region's counters would
// un-count the units its processes hold in capacity leases, so the
// command checks -region and refuses, rather than reset the plain key
// (nothing the authorizer reads).
func (o *options) refuseShares() error {
	name, place, list, err := o.regionPlace()
	if err != nil {
		return err
	}
	head := fmt.Sprintf("rule %s has scope global on an eventual table", o.rule)
	where := fmt.Sprintf("region %s (place %d of %s) decides it on its own items against its share, not on this key", name, place, list)
	return fmt.Errorf("reset refused, nothing changed: %s: %w: %s; resetting them is not offered: units its processes hold in capacity leases would be spent on top of its share (docs/operator.md). The share gives itself back: a window's units leave its view a window and a sub-window after they were taken, a bucket refills at its share's rate", head, errShares, where)
}

// shareLimit is a global rule's limit as the authorizer keeps it on an
// eventual table (functions/wiring's regional shares): read here, never
// decided.
type shareLimit struct{ kc regions.KeysConfig }

func (s *shareLimit) AllowN(context.Context, string, time.Time, int64) (limiter.Decision, error) {
	return limiter.Decision{}, errShares
}

func (s *shareLimit) Refund(context.Context, string, time.Time, int64) error { return errShares }

// shareHeader is what a region's shares are of.
type shareHeader struct {
	header
	Region  string   `json:"region"`
	Place   int      `json:"place"`
	Regions []string `json:"regions"`
}

// shareRow is one limit's share in the region: the share in force at the
// command's clock and what is left of it (RetryAfterMS nil: no wait can
// be told, no share is in force), the region's entry, and each region's
// share as the ledger entries read show them.
type shareRow struct {
	Name         string    `json:"limit"`
	Algorithm    string    `json:"algorithm"`
	Backend      string    `json:"backend"`
	Capacity     int64     `json:"global_capacity"`
	Share        int64     `json:"share"`
	Remaining    int64     `json:"remaining"`
	ResetAfterMS int64     `json:"reset_after_ms"`
	RetryAfterMS *int64    `json:"retry_after_ms"`
	Allowed      bool      `json:"allowed"`
	Withheld     int64     `json:"withheld"`
	Ahead        []capStep `json:"caps_ahead,omitempty"`
	Published    bool      `json:"published"`
	Until        time.Time `json:"entry_until,omitzero"`
	Valid        bool      `json:"entry_valid"`
	Item         string    `json:"item"`
	Counter      string    `json:"counter,omitempty"`
	Ledger       []int64   `json:"ledger_shares"`
	view         regions.ShareView
}

// capStep is a window's cap from a later stamp on.
type capStep struct {
	At  time.Time `json:"at"`
	Cap int64     `json:"cap"`
}

// inspectShares is inspect of a global rule on an eventual table: for each
// limit of the rule (or tier), the region's share as the authorizer's
// processes there decide by it, and what is left of it, read from the
// state table (regions.KeysConfig.Inspect: reads only). The limits are
// bound as the authorizer binds them (policy.Shares, wiring.SharesKeys).
func inspectShares(ctx context.Context, e env, o *options, rule policy.Rule, source string) error {
	name, place, list, err := o.regionPlace()
	if err != nil {
		return err
	}
	if o.dynamoTable == "" {
		return usageError{fmt.Errorf("rule %s has scope global on an eventual table: its regions' shares are in the state table: give it with -dynamo-table NAME (and -dynamo-endpoint URL for DynamoDB Local)", o.rule)}
	}
	names := strings.Split(list, ",")
	p, err := bindShares(ctx, o, rule, source, place, names)
	if err != nil {
		return err
	}
	key, err := renderKey(p, o)
	if err != nil {
		return err
	}
	tier := o.tier
	if tier == "" {
		tier = policy.DefaultTier
	}
	h := shareHeader{header: header{Rule: o.rule, Tier: tier, Key: key}, Region: name, Place: place, Regions: names}
	now := e.now()
	rows, err := readShares(ctx, p, o, key, h, list, now)
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			shareHeader
			Shares []shareRow `json:"shares"`
		}{h, rows})
	}
	return printShares(e.stdout, h, list, rows, now)
}

// bindShares binds the rule's limits as the authorizer binds them in
// region place of the regions names (policy.Shares, wiring.SharesKeys),
// on the state table.
func bindShares(ctx context.Context, o *options, rule policy.Rule, source string, place int, names []string) (*policy.Policy, error) {
	client, err := dynamoClient(ctx, o)
	if err != nil {
		return nil, err
	}
	st, err := dynamo.New(client, dynamo.Config{Table: o.dynamoTable, Timeout: o.timeout})
	if err != nil {
		return nil, fmt.Errorf("-dynamo-table: %w", err)
	}
	build := func(l *policy.Limit, _ int64, leases bool) (limiter.Limiter, error) {
		kc := wiring.SharesKeys(l, names, leases)
		kc.Table = regions.Table{Client: client, Table: o.dynamoTable, Region: place}
		kc.Store = st
		return &shareLimit{kc: kc}, nil
	}
	p, err := policy.New([]policy.Rule{rule}, policy.Options{Stores: map[string]storage.Store{"dynamo": st}, DefaultBackend: "dynamo",
		Shares: &policy.Shares{Regions: len(names), Build: build}})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return p, nil
}

// readShares reads the region's share of each limit of the rule (or
// tier) for key (regions.KeysConfig.Inspect: reads only).
func readShares(ctx context.Context, p *policy.Policy, o *options, key string, h shareHeader, list string, now time.Time) ([]shareRow, error) {
	lims, defs, err := p.Limits(o.rule, o.tier)
	if err != nil {
		return nil, usageError{err}
	}
	rows := make([]shareRow, len(lims))
	for i, l := range lims {
		sl, ok := l.(*shareLimit)
		if !ok {
			return nil, fmt.Errorf("limit %s: %T is not a regional share", defs[i].Name, l)
		}
		v, err := sl.kc.Inspect(ctx, key, now)
		if err != nil {
			return nil, fmt.Errorf("inspect %s/%s: region %s (place %d of %s): %w", o.rule, defs[i].Name, h.Region, h.Place, list, err)
		}
		r := shareRow{Name: defs[i].Name, Algorithm: defs[i].Algorithm.String(), Backend: "dynamo", Capacity: defs[i].Capacity(),
			Share: v.Share, Remaining: v.Decision.Remaining, ResetAfterMS: ceilMS(v.Decision.ResetAfter), Allowed: v.Decision.Allowed,
			Withheld: v.Withheld, Published: v.Published, Until: v.Until, Valid: v.Published && now.Before(v.Until),
			Item: v.Item, Counter: v.Counter, Ledger: v.Ledger, view: v}
		for _, c := range v.Ahead {
			r.Ahead = append(r.Ahead, capStep{At: time.Unix(0, c.At).UTC(), Cap: c.Cap})
		}
		if v.RetryKnown {
			ms := ceilMS(v.Decision.RetryAfter)
			r.RetryAfterMS = &ms
		}
		rows[i] = r
	}
	return rows, nil
}

// printShares writes the rows as a table, with what a lapsed entry and
// an unknown retry mean.
func printShares(w io.Writer, h shareHeader, list string, rows []shareRow, now time.Time) error {
	fmt.Fprintf(w, "rule %s, tier %s, key %s\n", h.Rule, h.Tier, h.Key)
	fmt.Fprintf(w, "scope global on an eventual table: region %s's share (place %d of %s), as its processes decide by it\n", h.Region, h.Place, list)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tALGORITHM\tGLOBAL\tREGION-SHARE\tREMAINING\tRESET-AFTER\tRETRY-AFTER\tWITHHELD\tCAP-AHEAD\tENTRY\tLEDGER-SHARES")
	var lapsed, unknown bool
	for _, r := range rows {
		lapsed = lapsed || !r.Valid
		unknown = unknown || r.RetryAfterMS == nil
		retry := "-"
		if r.RetryAfterMS != nil {
			retry = round(r.view.Decision.RetryAfter).String()
		}
		entry := "none published"
		switch {
		case r.Valid:
			entry = "valid until " + r.Until.UTC().Format(time.RFC3339Nano)
		case r.Published:
			entry = "lapsed " + r.Until.UTC().Format(time.RFC3339Nano)
		}
		ledger := make([]string, len(r.Ledger))
		for i, s := range r.Ledger {
			ledger[i] = strconv.FormatInt(s, 10)
		}
		ahead := make([]string, len(r.Ahead))
		for i, c := range r.Ahead {
			ahead[i] = fmt.Sprintf("%d in %v", c.Cap, round(c.At.Sub(now)))
		}
		if len(ahead) == 0 {
			ahead = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%v\t%s\t%d\t%s\t%s\t%s\n", r.Name, r.Algorithm, r.Capacity, r.Share, r.Remaining,
			round(r.view.Decision.ResetAfter), retry, r.Withheld, strings.Join(ahead, ", "), entry, strings.Join(ledger, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if lapsed {
		fmt.Fprintln(w, "A lapsed entry (or none) is not used: the region's next decision of the key waits for its agent to publish one; the share shown is the last published.")
	}
	if unknown {
		fmt.Fprintln(w, "RETRY-AFTER -: no share in force, no wait can be told (a grant to the region ends it).")
	}
	return nil
}

// regionPlace checks -region and -regions as the authorizer checks its
// variables (config.Parse) and returns the region, its place and the
// regions.
func (o *options) regionPlace() (string, int, string, error) {
	region := strings.TrimSpace(o.region)
	if region == "" {
		return "", 0, "", usageError{fmt.Errorf("rule %s has scope global on an eventual table: give the region whose share to read with -region NAME (default: %s)", o.rule, config.EnvAWSRegion)}
	}
	env, err := config.Parse(func(k string) string {
		switch k {
		case config.EnvTableMode:
			return config.TableEventual
		case config.EnvRegions:
			return o.regions
		case config.EnvAWSRegion:
			return region
		}
		return ""
	})
	if err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			flag := map[string]string{config.EnvRegions: "-regions", config.EnvAWSRegion: "-region"}[ce.Name]
			if flag != "" {
				return "", 0, "", usageError{fmt.Errorf("%s (or %s): %s", flag, ce.Name, ce.Msg)}
			}
		}
		return "", 0, "", err
	}
	return env.Regions[env.Region], env.Region, strings.Join(env.Regions, ","), nil
}
