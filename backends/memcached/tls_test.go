package memcached_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backends/memcached"
	"github.com/sluicehq/sluice/internal/testserver"
	"github.com/sluicehq/sluice/limiter"
)

// tlsProxy terminates TLS with a certificate for names and forwards the
// plaintext to backend: memcached behind TLS, as on ElastiCache Serverless.
// It records the server names clients asked for (SNI).
type tlsProxy struct {
	addr  string
	roots *x509.CertPool
	mu    sync.Mutex
	sni   []string
}

func (p *tlsProxy) serverNames() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.sni...)
}

func startTLSProxy(t *testing.T, backend string, names ...string) *tlsProxy {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: names[0]},
		DNSNames:              names,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsProxy{roots: x509.NewCertPool()}
	p.roots.AddCert(cert)
	cfg := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			p.mu.Lock()
			p.sni = append(p.sni, hello.ServerName)
			p.mu.Unlock()
			return nil, nil
		},
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, b)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(b, c); b.Close() }()
			go func() { defer wg.Done(); io.Copy(c, b); c.Close() }()
		}
	}()
	return p
}

func TestTLS(t *testing.T) {
	p := startTLSProxy(t, testserver.Memcached(t), "cache.example.test", "localhost")
	_, port, _ := net.SplitHostPort(p.addr)
	decide := func(t *testing.T, s *memcached.Store) error {
		t.Helper()
		w, err := limiter.NewSlidingWindow(s, limiter.SlidingWindowConfig{Limit: 3, Window: time.Minute, SubWindows: 6})
		if err != nil {
			t.Fatal(err)
		}
		key := limitertestKey(t)
		for i, want := range []bool{true, true, true, false} {
			d, err := w.Allow(context.Background(), key, time.Now())
			if err != nil {
				return err
			}
			if d.Allowed != want {
				t.Fatalf("request %d over TLS: %+v", i, d)
			}
		}
		return nil
	}

	t.Run("ServerName", func(t *testing.T) {
		s := newStore(t, memcached.Config{Addrs: []string{p.addr}, TLS: &tls.Config{RootCAs: p.roots}, ServerName: "cache.example.test"})
		if err := decide(t, s); err != nil {
			t.Fatal(err)
		}
		for _, n := range p.serverNames() {
			if n != "cache.example.test" {
				t.Fatalf("client sent SNI %q, want cache.example.test", n)
			}
		}
	})
	t.Run("ServerNameFromAddress", func(t *testing.T) {
		s := newStore(t, memcached.Config{Addrs: []string{net.JoinHostPort("localhost", port)}, TLS: &tls.Config{RootCAs: p.roots}})
		if err := decide(t, s); err != nil {
			t.Fatal(err)
		}
		if sni := p.serverNames(); sni[len(sni)-1] != "localhost" {
			t.Fatalf("client sent SNI %q, want localhost", sni[len(sni)-1])
		}
	})
	t.Run("WrongServerName", func(t *testing.T) {
		s := newStore(t, memcached.Config{Addrs: []string{p.addr}, TLS: &tls.Config{RootCAs: p.roots}, ServerName: "evil.example.test", Timeout: 2 * time.Second})
		err := decide(t, s)
		var verr *tls.CertificateVerificationError
		if !errors.Is(err, memcached.ErrUnavailable) || !errors.As(err, &verr) {
			t.Fatalf("certificate for another name: %v, want ErrUnavailable wrapping a verification error", err)
		}
	})
	t.Run("PlaintextToTLS", func(t *testing.T) {
		// Without TLS the client cannot talk to a TLS server: it fails,
		// typed, within the deadline.
		s := newStore(t, memcached.Config{Addrs: []string{p.addr}, Timeout: 300 * time.Millisecond})
		start := time.Now()
		if err := decide(t, s); !errors.Is(err, memcached.ErrUnavailable) {
			t.Fatalf("plaintext to a TLS server: %v, want ErrUnavailable", err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("plaintext to a TLS server failed after %v, deadline 300ms", el)
		}
	})
}
