package dynamo

import (
	"net"
	"net/http"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
)

// Bounds of the HTTP client [NewHTTPClient] returns.
const (
	// MaxConnsPerHost bounds the connections (dialing, in use and idle)
	// to one DynamoDB endpoint: a stalled endpoint cannot make the client
	// open more, whatever the request rate. A request that finds them all
	// busy waits for one, within its deadline.
	MaxConnsPerHost = 32
	// MaxIdleConnsPerHost is how many of them are kept open between
	// requests.
	MaxIdleConnsPerHost = MaxConnsPerHost
	// IdleConnTimeout closes a connection idle for this long.
	IdleConnTimeout = 30 * time.Second
)

// NewHTTPClient returns the SDK's buildable HTTP client (so that
// AWS_CA_BUNDLE and the SDK's TLS defaults still apply) for the DynamoDB
// client (aws.Config.HTTPClient, or awsconfig.WithHTTPClient), with every
// connection bounded by timeout, the store's deadline: connecting and the
// TLS handshake each give up after timeout, and at most [MaxConnsPerHost]
// connections per endpoint exist at once. The request itself is bounded by
// its context (the store's deadline), not here, so that a slower call on
// the same client (a rules table scan) is not cut short.
//
// The SDK's default transport connects with a 30 s timeout and allows
// thousands of connections per host: while DynamoDB stalls, each request
// whose deadline passes leaves its dial running (the transport finishes
// dials for requests that gave up, to pool the connection), so the open
// connections grow with the request rate for 30 s. With this client they
// end within timeout and never exceed the bound.
func NewHTTPClient(timeout time.Duration) *awshttp.BuildableClient {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = timeout }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.TLSHandshakeTimeout = timeout
			tr.MaxIdleConns = MaxIdleConnsPerHost
			tr.MaxIdleConnsPerHost = MaxIdleConnsPerHost
			tr.MaxConnsPerHost = MaxConnsPerHost
			tr.IdleConnTimeout = IdleConnTimeout
		})
}
