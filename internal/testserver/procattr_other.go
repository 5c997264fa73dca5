//go:build !linux

package testserver

import (
	"syscall"
	"time"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

// waitStopped returns at once: there is no /proc to read.
func waitStopped(int) {}

// cpuTime reports false: there is no /proc to read.
func cpuTime(int) (time.Duration, bool) { return 0, false }
