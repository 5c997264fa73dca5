package testserver

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy in front of a server that counts what the server
// receives: every read of client bytes is one request segment (a client's
// pipelined write arrives as one). Segments made only of memcached
// commands sent with noreply (refunds sent without waiting) are counted
// apart. It measures round trips at the wire, not by counting calls in the
// code. It closes its listener and connections when the test ends.
type Proxy struct {
	ln       net.Listener
	target   string
	segments atomic.Int64
	noreply  atomic.Int64
	bytes    atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
}

// ProxyCounts is what a Proxy counted.
type ProxyCounts struct {
	// Segments is the number of request segments that wait for a reply.
	Segments int64
	// NoReply is the number of segments holding only noreply commands.
	NoReply int64
	// Bytes is the number of request bytes.
	Bytes int64
}

// NewProxy starts a proxy in front of target (host:port).
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Counts returns the counts so far.
func (p *Proxy) Counts() ProxyCounts {
	return ProxyCounts{Segments: p.segments.Load(), NoReply: p.noreply.Load(), Bytes: p.bytes.Load()}
}

func (p *Proxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, s)
	p.mu.Unlock()
	go func() {
		io.Copy(c, s) //nolint:errcheck // ends with either side
		c.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.bytes.Add(int64(n))
			if onlyNoReply(buf[:n]) {
				p.noreply.Add(1)
			} else {
				p.segments.Add(1)
			}
			if _, werr := s.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	s.Close()
	c.Close()
}

// onlyNoReply reports whether every line of b is a command ending in
// " noreply" (memcached's text protocol; values never follow such a line
// here: only decr/incr/delete/touch are sent with noreply).
func onlyNoReply(b []byte) bool {
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\r\n")), []byte("\r\n"))
	for _, l := range lines {
		if !bytes.HasSuffix(l, []byte(" noreply")) {
			return false
		}
	}
	return len(lines) > 0
}
