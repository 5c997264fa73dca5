//go:build !linux

package testserver

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }

// waitStopped returns at once: there is no /proc to read.
func waitStopped(int) {}
