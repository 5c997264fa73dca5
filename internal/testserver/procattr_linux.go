package testserver

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// sysProcAttr asks the kernel to kill the server if the test process dies
// without running its cleanups (a panic or a `go test -timeout`).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits (up to 2 s) until every thread of process pid is
// stopped: SIGSTOP is delivered to a running thread only when it next
// enters the kernel, so on a loaded machine a thread may answer a request
// or two after kill returned (a stalled server's test saw one decision
// go through).
func waitStopped(pid int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && !allStopped(pid) {
		time.Sleep(time.Millisecond)
	}
}

// allStopped reads each thread's state in /proc (the field after the
// command's closing parenthesis): T is stopped by a signal.
func allStopped(pid int) bool {
	stats, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "stat"))
	if err != nil || len(stats) == 0 {
		return true // nothing to wait for
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that exited
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			continue
		}
		if s := b[i+2]; s != 'T' && s != 't' && s != 'Z' && s != 'X' {
			return false
		}
	}
	return true
}

// cpuTime is the CPU time (user and system) process pid has used, from
// /proc (in USER_HZ ticks, 100 a second); false if it cannot be read.
func cpuTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	i := bytes.LastIndexByte(b, ')')
	if err != nil || i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:]) // from the state, field 3: utime is 14, stime 15
	if len(f) < 13 {
		return 0, false
	}
	u, uerr := strconv.ParseInt(string(f[11]), 10, 64)
	k, kerr := strconv.ParseInt(string(f[12]), 10, 64)
	if uerr != nil || kerr != nil {
		return 0, false
	}
	return time.Duration(u+k) * (time.Second / 100), true
}
