package testserver

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// HTTPProxy is a reverse proxy in front of an HTTP server (DynamoDB Local)
// that records every request the server receives: the operation (the
// suffix of X-Amz-Target, e.g. "UpdateItem"), when it arrived and when the
// server's answer was passed back. It counts at the wire, not in the code:
// SDK retries and lost conditional writes are requests too. It closes when
// the test ends.
type HTTPProxy struct {
	srv    *httptest.Server
	delay  atomic.Int64 // ns each request is held before it is passed on
	jitter atomic.Int64 // ns up to which a request is held longer (uniform)
	// hold, if set, is called with a request's operation before it is
	// passed on, and what it returns once the answer is back (a region's
	// gate, regions.go).
	hold func(op string) (release func())
	// names: each request is recorded with the first of them its body
	// contains (HTTPRequest.Key).
	names []string

	requestLog
}

// requestLog is a proxy's record of the requests it answered (Len,
// Since). Safe for concurrent use.
type requestLog struct {
	logMu sync.Mutex
	reqs  []HTTPRequest
}

func (l *requestLog) add(r HTTPRequest) {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	l.reqs = append(l.reqs, r)
}

func (l *requestLog) reset() {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	l.reqs = nil
}

// Len returns the number of requests recorded so far (a mark for Since).
func (l *requestLog) Len() int {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	return len(l.reqs)
}

// Since returns the requests recorded after mark (a Len), in the order
// their answers were passed back.
func (l *requestLog) Since(mark int) []HTTPRequest {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	return append([]HTTPRequest(nil), l.reqs[min(mark, len(l.reqs)):]...)
}

// HTTPRequest is one request an [HTTPProxy] passed on.
type HTTPRequest struct {
	// Op is the operation: X-Amz-Target after its last '.'.
	Op         string
	Start, End time.Time
	// Status is the server's HTTP status (0 when it did not answer).
	Status int
	// Key is the first of a tagging proxy's names the request's body
	// contains ("" for none, or an untagging proxy: NewTaggedHTTPProxy).
	Key string
}

// NewHTTPProxy starts a proxy in front of target (an http:// URL).
func NewHTTPProxy(t testing.TB, target string) *HTTPProxy {
	t.Helper()
	return newHTTPProxy(t, target, nil)
}

// NewTaggedHTTPProxy is NewHTTPProxy recording with each request the
// first of names its body contains (HTTPRequest.Key), and keeping up to
// 64 idle connections to target for requests in flight at once (the
// default keeps 2 a host and opens one for each request beyond).
func NewTaggedHTTPProxy(t testing.TB, target string, names ...string) *HTTPProxy {
	t.Helper()
	return newHTTPProxy(t, target, nil, names...)
}

func newHTTPProxy(t testing.TB, target string, hold func(op string) func(), names ...string) *HTTPProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatalf("testserver: proxy target %q: %v", target, err)
	}
	p := &HTTPProxy{hold: hold, names: names}
	rp := httputil.NewSingleHostReverseProxy(u)
	if len(names) > 0 {
		rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64}
	}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := r.Header.Get("X-Amz-Target")
		if i := strings.LastIndexByte(op, '.'); i >= 0 {
			op = op[i+1:]
		}
		rec := &statusWriter{ResponseWriter: w}
		start := time.Now()
		key, err := p.tag(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if d := p.delay.Load() + jitter(p.jitter.Load()); d > 0 {
			time.Sleep(time.Duration(d))
		}
		if p.hold != nil {
			release := p.hold(op)
			rp.ServeHTTP(rec, r)
			release()
		} else {
			rp.ServeHTTP(rec, r)
		}
		p.add(HTTPRequest{Op: op, Start: start, End: time.Now(), Status: rec.status, Key: key})
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// tag returns the first of p's names r's body contains, the body left to
// be read again; "" for none, or a proxy without names.
func (p *HTTPProxy) tag(r *http.Request) (string, error) {
	if len(p.names) == 0 {
		return "", nil
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return "", err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	for _, n := range p.names {
		if bytes.Contains(body, []byte(n)) {
			return n, nil
		}
	}
	return "", nil
}

// SetDelay holds every request d before passing it on, as a network's
// latency would: requests sent at once then overlap at the proxy by d,
// whatever the scheduling of a loaded machine, and requests sent one after
// another cannot (see Waves).
func (p *HTTPProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// SetJitter holds every request up to j longer than SetDelay's (uniformly
// at random), as a loaded host's requests vary.
func (p *HTTPProxy) SetJitter(j time.Duration) { p.jitter.Store(int64(j)) }

func jitter(j int64) int64 {
	if j <= 0 {
		return 0
	}
	return rand.Int64N(j)
}

// URL returns the proxy's endpoint URL.
func (p *HTTPProxy) URL() string { return p.srv.URL }

// Waves returns how many round trips of latency reqs took one after
// another: requests that overlap in time are one wave, a request that
// starts after every earlier one has ended starts a new one.
func Waves(reqs []HTTPRequest) int {
	rs := append([]HTTPRequest(nil), reqs...)
	for i := 1; i < len(rs); i++ { // by start; a few requests
		for j := i; j > 0 && rs[j].Start.Before(rs[j-1].Start); j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
	waves := 0
	var end time.Time
	for _, r := range rs {
		if waves == 0 || r.Start.After(end) {
			waves++
		}
		if r.End.After(end) {
			end = r.End
		}
	}
	return waves
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}
