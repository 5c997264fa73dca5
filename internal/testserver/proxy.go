package testserver

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
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

	mu     sync.Mutex
	conns  []net.Conn
	log    []string // each segment's commands, for failure messages
	record bool     // keep every byte sent (Record)
	sent   []byte
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

// Log returns the commands of each segment from the i-th on (see Len), a
// segment's commands joined by "+".
func (p *Proxy) Log(i int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log[min(i, len(p.log)):]...)
}

// Len returns the number of segments so far (both kinds).
func (p *Proxy) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.log)
}

// commands lists the command names of a segment (the first word of each
// line that starts with a lower-case letter), joined by "+".
func commands(b []byte) string {
	var out []string
	for _, l := range bytes.Split(b, []byte("\r\n")) {
		if len(l) > 0 && l[0] >= 'a' && l[0] <= 'z' {
			f := bytes.Fields(l)
			out = append(out, string(f[0]))
		}
	}
	return strings.Join(out, "+")
}

// Record makes the proxy keep every byte its clients send from now on, for
// tests that read the commands' arguments (keys), not only their names.
func (p *Proxy) Record() {
	p.mu.Lock()
	p.record = true
	p.mu.Unlock()
}

// SentLen is the number of bytes kept since Record.
func (p *Proxy) SentLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sent)
}

// Sent returns a copy of the bytes kept from byte i on.
func (p *Proxy) Sent(i int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Clone(p.sent[min(i, len(p.sent)):])
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
			p.mu.Lock()
			p.log = append(p.log, commands(buf[:n]))
			if p.record {
				p.sent = append(p.sent, buf[:n]...)
			}
			p.mu.Unlock()
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

// onlyNoReply reports whether every command in b (memcached's text
// protocol) is sent with noreply; a storage command's data block is
// skipped.
func onlyNoReply(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for len(b) > 0 {
		line, rest, ok := bytes.Cut(b, []byte("\r\n"))
		if !ok || !bytes.HasSuffix(line, []byte(" noreply")) {
			return false
		}
		f := bytes.Fields(line)
		switch string(f[0]) {
		case "set", "add", "replace", "append", "prepend", "cas":
			if len(f) < 5 {
				return false
			}
			n, err := strconv.Atoi(string(f[4]))
			if err != nil || n < 0 || len(rest) < n+2 {
				return false
			}
			rest = rest[n+2:]
		}
		b = rest
	}
	return true
}
