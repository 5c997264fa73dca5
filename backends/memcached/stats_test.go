package memcached_test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// statsOf returns the numeric fields of memcached's "stats" at addr
// (gomemcache has no stats call); the CPU times (rusage_user,
// rusage_system: seconds with a fraction) in microseconds.
func statsOf(addr string) (map[string]int64, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "END" {
			return out, nil
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "STAT" {
			return nil, fmt.Errorf("stats: unexpected line %q", line)
		}
		if v, err := strconv.ParseInt(f[2], 10, 64); err == nil {
			out[f[1]] = v
		} else if v, err := strconv.ParseFloat(f[2], 64); err == nil && strings.HasPrefix(f[1], "rusage_") {
			out[f[1]] = int64(v * 1e6)
		}
	}
}
