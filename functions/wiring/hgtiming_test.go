package wiring

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"
)

// reqTimes is a reverse proxy in front of a DynamoDB endpoint that
// records when each request whose body names one of a few keys was sent
// and answered (or given up by its client), as seen from the client's
// side of the store: TestHotGlobalKeyStaysOnItsKey reads from it how
// long a decision's own requests took and how long a sweep's request of
// another key held it. It closes when the test ends.
type reqTimes struct {
	srv   *httptest.Server
	names []string
	mu    sync.Mutex
	reqs  []timedReq
}

// timedReq is one recorded request: the key it names (the first of the
// names its body contains), its start and end.
type timedReq struct {
	name       string
	start, end time.Time
}

func newReqTimes(t *testing.T, target string, names ...string) *reqTimes {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &reqTimes{names: names}
	rp := httputil.NewSingleHostReverseProxy(u)
	// Its connections kept for the open loop's requests in flight (the
	// default keeps 2 idle a host, and opens one per request beyond).
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
		for _, n := range p.names {
			if bytes.Contains(body, []byte(n)) {
				p.mu.Lock()
				p.reqs = append(p.reqs, timedReq{name: n, start: start, end: time.Now()})
				p.mu.Unlock()
				break
			}
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// URL is the proxy's endpoint.
func (p *reqTimes) URL() string { return p.srv.URL }

// within returns, for the requests naming name that overlap [from, to],
// the sum of the time each spent inside it and the longest of them.
func (p *reqTimes) within(name string, from, to time.Time) (sum, longest time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.reqs {
		if r.name != name || r.end.Before(from) || r.start.After(to) {
			continue
		}
		s, e := r.start, r.end
		if s.Before(from) {
			s = from
		}
		if e.After(to) {
			e = to
		}
		sum += e.Sub(s)
		longest = max(longest, r.end.Sub(r.start))
	}
	return sum, longest
}
