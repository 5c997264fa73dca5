package wiring

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"
)

// keyDelay is a reverse proxy in front of a DynamoDB endpoint that holds
// back every request whose body names a chosen key (its partition key
// values carry it: the store's items, the ledger entries) until its
// client gives up, as a partition that stopped answering would: the
// request is never passed on. The others pass at once. It closes when
// the test ends.
type keyDelay struct {
	srv   *httptest.Server
	match atomic.Pointer[[]byte] // nil: hold none
	held  atomic.Int64
}

// keyDelayMax bounds a hold whose client never gives up (the proxy's
// Close waits for its handlers).
const keyDelayMax = 30 * time.Second

func newKeyDelay(t *testing.T, target string) *keyDelay {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	d := &keyDelay{}
	rp := httputil.NewSingleHostReverseProxy(u)
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if m := d.match.Load(); m != nil && bytes.Contains(body, *m) {
			d.held.Add(1)
			select {
			case <-r.Context().Done():
			case <-time.After(keyDelayMax):
			}
			http.Error(w, "held", http.StatusGatewayTimeout)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

// Hold holds back the requests whose body contains s ("" holds none).
func (d *keyDelay) Hold(s string) {
	if s == "" {
		d.match.Store(nil)
		return
	}
	b := []byte(s)
	d.match.Store(&b)
}

// URL is the proxy's endpoint.
func (d *keyDelay) URL() string { return d.srv.URL }

// Held is the number of requests held back so far.
func (d *keyDelay) Held() int64 { return d.held.Load() }
