package regions

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluicehq/sluice/internal/testserver"
)

// TestRoleKeptUnderSlowTicks: a holder whose ticks are slow keeps the
// agent role while it ticks. Region 0's agent A reaches DynamoDB Local
// through a proxy that holds every request 150 ms (a loaded host: its
// ticks, three requests one after another, take about 450 ms, its next
// tick follows at once), while another container's agent B of the same
// region, with a fast client, tries to take the role every 50 ms (a tick:
// it takes the role only once it has lapsed). With the role extended from
// the tick's stamp only (the broken run, as before), it lapses before A's
// next save lands whenever two of A's ticks outlast LockLife (750 ms): B
// takes it and A's save is refused. The two runs (agents of their own)
// run at once, through the same proxy.
//
// The outcome is judged against the lapse rule (tableAgent.lapse) from
// A's measured ticks, not against the proxy's 150 ms: on a loaded host
// DynamoDB Local itself may hold a tick for seconds, and a tick that
// outlasts the rule's lapse loses the role by design. Each of A's saves
// gives the role until the rule's lapse L, computed from how long the
// tick took before its save was sent (at least until the tick's last
// answer before the save: rolePairs), and the pair of that save and A's
// next tick met the premise when the next tick returned by L. B takes
// the role at its tick's stamp only past the lapse of the save it read,
// before A's next save landed: inside a pair that missed the premise. A
// takeover outside every such pair is the failure; the broken run must
// show one. A run with fewer than roleChecked of B's ticks inside pairs
// that met the premise checked too little and runs again (and a broken
// run without such a takeover), roleAttempts times at most.
func TestRoleKeptUnderSlowTicks(t *testing.T) {
	client, table := testTable(t)
	proxy := testserver.NewHTTPProxy(t, *client.Options().BaseEndpoint)
	proxy.SetDelay(150 * time.Millisecond)
	cfg := Config{Regions: 2, Key: "k", Limit: 100, Window: time.Second, SubWindows: 10}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			var runs []string
			for attempt := 1; attempt <= roleAttempts; attempt++ {
				res := roleRun(t, client, proxy.URL(), table, cfg, broken)
				runs = append(runs, res.String())
				t.Logf("attempt %d: %v", attempt, res)
				switch {
				case broken && res.unexcused:
					return // the judgement sees the broken lapse
				case res.unexcused:
					t.Fatalf("B took the role at %v, %v before the rule's lapse, while A's ticks met the rule", res.takenAt, res.lapseAt.Sub(res.takenAt))
				case !broken && res.checked >= roleChecked:
					return
				}
				// Checked too little (or, broken, B took no role the
				// rule kept): again.
			}
			if broken {
				t.Fatalf("the role extended from the tick's stamp only: B never took it from ticks that met the lapse rule in %d runs: %s",
					roleAttempts, strings.Join(runs, "; "))
			}
			t.Fatalf("A's ticks never met the lapse rule long enough to check it (%d of B's ticks needed) in %d runs: %s",
				roleChecked, roleAttempts, strings.Join(runs, "; "))
		})
	}
}

const (
	roleRunFor   = 4 * time.Second
	roleAttempts = 3
	// roleChecked is the least of B's ticks stamped inside pairs that
	// met the premise for a run to count.
	roleChecked = 5
)

// roleSaveExpr is the save's update (Table.save): how a request is
// known as the tick's save.
const roleSaveExpr = "SET s = :s, b = :b, x = :x"

// reqLog is an HTTP client that records each request's send and answer,
// and which were saves.
type reqLog struct {
	inner *http.Client
	mu    sync.Mutex
	reqs  []loggedReq
}

type loggedReq struct {
	sent, answered time.Time
	save, ok       bool
}

func (l *reqLog) Do(r *http.Request) (*http.Response, error) {
	save := false
	if r.Body != nil {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		save = bytes.Contains(body, []byte(roleSaveExpr))
	}
	sent := time.Now()
	resp, err := l.inner.Do(r)
	l.mu.Lock()
	l.reqs = append(l.reqs, loggedReq{sent: sent, answered: time.Now(), save: save, ok: err == nil && resp.StatusCode == http.StatusOK})
	l.mu.Unlock()
	return resp, err
}

// since is the requests recorded from the i-th on.
func (l *reqLog) since(i int) []loggedReq {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]loggedReq(nil), l.reqs[i:]...)
}

// roleTick is one of A's ticks: its stamp, when it returned, and, if it
// saved, the lapse the rule gives the save (zero: no save landed).
type roleTick struct {
	start, end time.Time
	lapse      time.Time
}

// ruleLapse is the lapse the rule gives the save of a tick stamped start
// whose requests are reqs: LockLife after the save is sent plus as long
// again as the tick took so far (at most LockLife), and no later than the
// entry's validity (tableAgent.lapse, save). The time the tick took is
// taken as until its last answer before the save was sent: a lower bound
// (the rule's clock reads later), so the lapse is never later than the
// agent's (zero: no save landed).
func ruleLapse(tb Table, start time.Time, reqs []loggedReq) time.Time {
	var took time.Duration
	for i, r := range reqs {
		if !r.save {
			continue
		}
		if !r.ok {
			return time.Time{}
		}
		for _, p := range reqs[:i] {
			if !p.answered.After(r.sent) {
				took = max(took, p.answered.Sub(start))
			}
		}
		return start.Add(took + min(tb.LockLife+min(took, tb.LockLife), tb.Validity))
	}
	return time.Time{}
}

// roleResult is a run's judgement.
type roleResult struct {
	aTicks, met, missed int
	checked             int // B's ticks stamped inside pairs that met the premise
	took                time.Duration
	takeovers, lost     int64
	takenAt, lapseAt    time.Time // B's take, and the lapse in force then (unexcused)
	unexcused           bool      // a take outside every pair that missed
}

func (r roleResult) String() string {
	s := fmt.Sprintf("A %d ticks (longest %v), pairs met %d, missed %d; B's ticks in met pairs %d; B took the role %d times, A lost it %d times",
		r.aTicks, r.took.Round(time.Millisecond), r.met, r.missed, r.checked, r.takeovers, r.lost)
	if r.unexcused {
		s += fmt.Sprintf(" (outside every missed pair, %v before the rule's lapse)", r.lapseAt.Sub(r.takenAt).Round(time.Millisecond))
	}
	return s
}

// roleRun runs A and B for roleRunFor on a fresh item and judges it.
func roleRun(t *testing.T, client *dynamodb.Client, slowURL, table string, cfg Config, broken bool) roleResult {
	t.Helper()
	ctx := t.Context()
	log := &reqLog{inner: &http.Client{}}
	slow := dynamodb.New(dynamodb.Options{BaseEndpoint: aws.String(slowURL), Region: "us-east-1",
		Credentials: client.Options().Credentials, HTTPClient: log})
	name := fmt.Sprintf("role-%v-%d", broken, time.Now().UnixNano())
	agent := func(c *dynamodb.Client, holder string) *Agent {
		a, err := NewTableAgent(cfg, Table{Client: c, Table: table, Name: name, Region: 0}, holder, memStore(t))
		if err != nil {
			t.Fatal(err)
		}
		a.tbl.brokenLife = broken
		return a
	}
	a, b := agent(slow, "slow"), agent(client, "fast")
	var ticks []roleTick
	tick := func() error {
		n := len(log.since(0))
		start := time.Now()
		err := a.Tick(ctx, start)
		ticks = append(ticks, roleTick{start: start, end: time.Now(), lapse: ruleLapse(a.tbl.t, start, log.since(n))})
		return err
	}
	// A takes the role first.
	if err := tick(); err != nil || !a.Holds() {
		t.Fatalf("A's first tick: holds %v, %v", a.Holds(), err)
	}
	var (
		stopA, stopB = make(chan struct{}), make(chan struct{})
		wg           sync.WaitGroup
		bTicks       []time.Time
		takenAt      time.Time
	)
	wg.Go(func() {
		for {
			select {
			case <-stopA:
				return
			default:
			}
			if err := tick(); err != nil && ctx.Err() == nil {
				t.Errorf("A's tick: %v", err)
			}
		}
	})
	bDone := make(chan struct{})
	go func() {
		defer close(bDone)
		for {
			select {
			case <-stopB:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if b.Holds() {
				continue // it took the role: A lost it
			}
			// No deadline: a slow tick only stamps B's try earlier.
			at := time.Now()
			if err := b.Tick(ctx, at); err != nil && ctx.Err() == nil {
				t.Errorf("B's tick: %v", err)
			}
			bTicks = append(bTicks, at)
			if b.Holds() {
				takenAt = at
			}
		}
	}()
	time.Sleep(roleRunFor)
	// B stops first: A's next tick follows every try of B's.
	close(stopB)
	<-bDone
	close(stopA)
	wg.Wait()
	res := judgeRole(ticks, bTicks, takenAt)
	res.takeovers, res.lost = b.TableStats().Takeovers, a.TableStats().Lost
	if res.lost > res.takeovers {
		t.Errorf("A lost the role %d times, B took it %d times: lost to nobody", res.lost, res.takeovers)
	}
	return res
}

// judgeRole judges a run: each of A's ticks that saved, with the tick
// after it, met the premise when the next returned by the save's lapse.
// B's ticks stamped between the two count as checked. B's take
// (takenAt, zero: none) is excused only past a save's lapse and before
// the next tick returned (the pair missed); lapseAt is the lapse of the
// save before the take.
func judgeRole(ticks []roleTick, bTicks []time.Time, takenAt time.Time) roleResult {
	res := roleResult{aTicks: len(ticks), takenAt: takenAt, unexcused: !takenAt.IsZero()}
	for i, tk := range ticks {
		res.took = max(res.took, tk.end.Sub(tk.start))
		if tk.lapse.IsZero() || i+1 == len(ticks) {
			continue
		}
		next := ticks[i+1].end
		in := func(at time.Time) bool { return !at.Before(tk.end) && !at.After(next) }
		if in(takenAt) {
			res.lapseAt = tk.lapse
		}
		if takenAt.After(tk.lapse) && !takenAt.After(next) {
			res.unexcused = false
		}
		if next.After(tk.lapse) {
			res.missed++
			continue
		}
		res.met++
		for _, at := range bTicks {
			if in(at) && (takenAt.IsZero() || !at.After(takenAt)) {
				res.checked++
			}
		}
	}
	return res
}
