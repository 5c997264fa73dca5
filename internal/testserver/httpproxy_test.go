package testserver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A tagging proxy records each request with the first of its names the
// body contains, and passes the body on whole.
func TestTaggedHTTPProxy(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
	}))
	defer srv.Close()
	p := NewTaggedHTTPProxy(t, srv.URL, "alpha", "beta")
	bodies := []string{`{"k":"beta"}`, `{"k":"gamma"}`, `{"k":"alpha beta"}`}
	for _, b := range bodies {
		resp, err := http.Post(p.URL(), "application/json", strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	reqs := p.Since(0)
	want := []string{"beta", "", "alpha"}
	if len(reqs) != len(want) {
		t.Fatalf("%d requests recorded, want %d", len(reqs), len(want))
	}
	for i, r := range reqs {
		if r.Key != want[i] || got[i] != bodies[i] {
			t.Errorf("request %d: key %q, server read %q; want %q, %q", i, r.Key, got[i], want[i], bodies[i])
		}
	}
}
