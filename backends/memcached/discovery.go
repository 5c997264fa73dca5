package memcached

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrDiscovery is wrapped when ElastiCache auto discovery fails or returns
// something that is not a node list.
var ErrDiscovery = errors.New("memcached: auto discovery failed")

// discover asks the configuration endpoint at endpoint for the cluster's
// nodes with "config get cluster" (ElastiCache for Memcached 1.4.14 and
// later), falling back to "get AmazonElastiCache:cluster" when the server
// does not know the command. It returns the cluster config version and the
// node addresses (hostname:port, or ip:port when a node has no hostname).
func discover(ctx context.Context, dial dialFunc, endpoint string) (version int64, nodes []string, err error) {
	nc, err := dial(ctx, "tcp", endpoint)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %s: %w", ErrDiscovery, endpoint, err)
	}
	defer nc.Close()
	if d, ok := ctx.Deadline(); ok {
		nc.SetDeadline(d)
	}
	// Close the connection if ctx is cancelled while we wait.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	rw := bufio.NewReadWriter(bufio.NewReader(nc), bufio.NewWriter(nc))
	body, err := configGet(rw, "config get cluster\r\n", "CONFIG cluster ")
	if errors.Is(err, errUnknownCommand) {
		body, err = configGet(rw, "get AmazonElastiCache:cluster\r\n", "VALUE AmazonElastiCache:cluster ")
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			// The socket deadline is ctx's.
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		return 0, nil, fmt.Errorf("%w: %s: %w", ErrDiscovery, endpoint, err)
	}
	version, nodes, err = parseClusterConfig(body)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %s: %w", ErrDiscovery, endpoint, err)
	}
	return version, nodes, nil
}

var errUnknownCommand = errors.New("server does not know the command")

// maxConfigSize bounds the cluster config read (a few hundred nodes).
const maxConfigSize = 1 << 20

// configGet sends cmd and reads a response of the form
//
//	<prefix><flags> <bytes>\r\n<data>\r\nEND\r\n
func configGet(rw *bufio.ReadWriter, cmd, prefix string) ([]byte, error) {
	if _, err := rw.WriteString(cmd); err != nil {
		return nil, err
	}
	if err := rw.Flush(); err != nil {
		return nil, err
	}
	line, err := rw.ReadString('\n')
	if err != nil {
		return nil, err
	}
	switch {
	case line == "ERROR\r\n":
		return nil, errUnknownCommand
	case line == "END\r\n":
		return nil, errors.New("no cluster config (not an ElastiCache configuration endpoint?)")
	case !strings.HasPrefix(line, prefix) || !strings.HasSuffix(line, "\r\n"):
		return nil, fmt.Errorf("unexpected reply %.80q", line)
	}
	f := strings.Fields(strings.TrimPrefix(line, prefix))
	if len(f) != 2 {
		return nil, fmt.Errorf("unexpected reply %.80q", line)
	}
	size, err := strconv.Atoi(f[1])
	if err != nil || size < 0 || size > maxConfigSize {
		return nil, fmt.Errorf("unexpected size in reply %.80q", line)
	}
	data := make([]byte, size+2)
	if _, err := io.ReadFull(rw, data); err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(data, []byte("\r\n")) {
		return nil, errors.New("cluster config not terminated by CRLF")
	}
	if end, err := rw.ReadString('\n'); err != nil {
		return nil, err
	} else if end != "END\r\n" {
		return nil, fmt.Errorf("unexpected line %.80q after cluster config", end)
	}
	return data[:size], nil
}

// parseClusterConfig parses
//
//	<version>\n<host>|<ip>|<port> <host>|<ip>|<port> ...\n
func parseClusterConfig(b []byte) (int64, []string, error) {
	lines := strings.Split(strings.TrimRight(string(b), "\r\n"), "\n")
	if len(lines) < 2 {
		return 0, nil, fmt.Errorf("cluster config %.80q: want a version line and a node line", b)
	}
	version, err := strconv.ParseInt(strings.TrimSpace(lines[0]), 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("cluster config version %.40q: %w", lines[0], err)
	}
	var nodes []string
	for _, n := range strings.Fields(lines[1]) {
		parts := strings.Split(n, "|")
		if len(parts) != 3 {
			return 0, nil, fmt.Errorf("cluster config node %.80q: want host|ip|port", n)
		}
		host := parts[0]
		if host == "" {
			host = parts[1]
		}
		if host == "" {
			return 0, nil, fmt.Errorf("cluster config node %.80q: no host or ip", n)
		}
		a := net.JoinHostPort(host, parts[2])
		if _, err := parseAddr(a); err != nil {
			return 0, nil, err
		}
		nodes = append(nodes, a)
	}
	if len(nodes) == 0 {
		return 0, nil, errors.New("cluster config lists no nodes")
	}
	return version, nodes, nil
}
