//go:build unix

package testserver

import "syscall"

// Pause stops the server's process with SIGSTOP, by its PID: it keeps its
// port and its connections, the kernel still completes handshakes until the
// listen backlog is full, and nothing is answered (a stalled server). Resume
// continues it. Pausing a stopped server does nothing.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if err := syscall.Kill(s.cmd.Process.Pid, sig); err != nil {
		s.t.Fatalf("testserver: %s: %v", sig, err)
	}
	if sig == syscall.SIGSTOP {
		waitStopped(s.cmd.Process.Pid)
	}
}
