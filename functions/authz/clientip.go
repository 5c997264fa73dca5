package authz

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/policy"
)

// Sources of the client address, the {ip} of the rules (Config.ClientIP):
// the values of SLUICE_CLIENT_IP in the configuration contract.
const (
	// ClientIPSourceIP is the request context's source IP: the address
	// that connected to API Gateway. The default.
	ClientIPSourceIP = config.ClientIPSourceIP
	// ClientIPViewerAddress is the address in the CloudFront-Viewer-Address
	// header, for an API behind a CloudFront distribution (the edge front
	// door), whose source IP is a CloudFront server's. It is trusted only
	// in requests that carry the distribution's secret ([EdgeSecretHeader]).
	ClientIPViewerAddress = config.ClientIPViewerAddress
)

// ViewerAddressHeader is the header CloudFront sets to the viewer's
// address and port when the distribution's origin request policy
// includes it: "198.51.100.7:443", "2001:db8::1:443" (IPv6 without
// brackets).
const ViewerAddressHeader = config.ViewerAddressHeader

// EdgeSecretHeader is the origin custom header the CloudFront distribution
// adds to every request it sends to the API, with Config.EdgeSecret as its
// value: it tells a request that came through CloudFront from one that
// reached the API directly, whose CloudFront-Viewer-Address would be the
// caller's to forge.
const EdgeSecretHeader = config.EdgeSecretHeader

// checkClientIP validates Config.ClientIP and Config.EdgeSecret.
func checkClientIP(cfg *Config) error {
	switch cfg.ClientIP {
	case "":
		cfg.ClientIP = ClientIPSourceIP
	case ClientIPSourceIP:
	case ClientIPViewerAddress:
		if cfg.EdgeSecret == "" {
			return fmt.Errorf("authz: ClientIP %s needs an EdgeSecret: without one, any caller that reaches the API directly picks its own address", ClientIPViewerAddress)
		}
	default:
		return fmt.Errorf("authz: ClientIP %q is not %s or %s", cfg.ClientIP, ClientIPSourceIP, ClientIPViewerAddress)
	}
	return nil
}

// viewerAddress replaces req.SourceIP with the CloudFront viewer's
// address when the request came through the distribution (it carries the
// edge secret) and the header holds an IP address and a port. It reports
// whether the request carried the secret but no usable address (a
// distribution that does not forward the header).
func (h *Handler) viewerAddress(req *policy.Request) (missing bool) {
	if req.SourceIP == "" { // a TOKEN event: no address, no headers
		return false
	}
	secret, ok := req.Header(EdgeSecretHeader)
	if !ok || subtle.ConstantTimeCompare([]byte(secret), []byte(h.cfg.EdgeSecret)) != 1 {
		return false // not through CloudFront: keyed by the caller's own address
	}
	v, ok := req.Header(ViewerAddressHeader)
	if !ok {
		return true
	}
	ip, ok := parseViewerAddress(v)
	if !ok {
		return true
	}
	req.SourceIP = ip
	return false
}

// parseViewerAddress returns the IP address of a CloudFront-Viewer-Address
// value: "IPv4:port", "IPv6:port" (CloudFront's form, unbracketed) or
// "[IPv6]:port".
func parseViewerAddress(v string) (string, bool) {
	v = strings.TrimSpace(v)
	var host, port string
	if strings.HasPrefix(v, "[") {
		var err error
		if host, port, err = net.SplitHostPort(v); err != nil {
			return "", false
		}
	} else {
		i := strings.LastIndexByte(v, ':')
		if i < 0 {
			return "", false
		}
		host, port = v[:i], v[i+1:]
	}
	if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return "", false
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return "", false
	}
	return a.Unmap().String(), true
}
