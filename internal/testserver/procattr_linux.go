package testserver

import "syscall"

// sysProcAttr asks the kernel to kill the server if the test process dies
// without running its cleanups (a panic or a `go test -timeout`).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
