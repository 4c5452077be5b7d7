package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// ErrBlockedAddress: a delivery would have connected to an address the
// SSRF guard refuses (see "The SSRF guard" in the package doc). It is an
// error, never a rejection: the address is the sink's, not a record's.
var ErrBlockedAddress = errors.New("webhook: address refused by the SSRF guard")

// BlockedAddressError names the address refused and why. It matches
// ErrBlockedAddress.
type BlockedAddressError struct {
	Addr netip.Addr
	Why  string // "loopback", "private", …
}

func (e *BlockedAddressError) Error() string {
	return fmt.Sprintf("%v: %s is a %s address (see webhook.allow_loopback and webhook.allow_private)", ErrBlockedAddress, e.Addr, e.Why)
}

// Is reports whether target is ErrBlockedAddress.
func (e *BlockedAddressError) Is(target error) bool { return target == ErrBlockedAddress }

var (
	sharedNet  = netip.MustParsePrefix("100.64.0.0/10") // carrier-grade NAT; Alibaba's metadata
	thisNet    = netip.MustParsePrefix("0.0.0.0/8")
	awsIPv6Md  = netip.MustParsePrefix("fd00:ec2::/32") // inside fc00::/7 too
	nat64Local = netip.MustParsePrefix("64:ff9b:1::/48")
)

// classify says why a is refused, or "" when it is a public address. Only
// allowLoopback and allowPrivate lift a class.
func classify(a netip.Addr, allowLoopback, allowPrivate bool) string {
	a = a.Unmap() // ::ffff:127.0.0.1 is 127.0.0.1
	switch {
	case a.IsLoopback():
		if allowLoopback {
			return ""
		}
		return "loopback"
	case a.IsUnspecified() || thisNet.Contains(a):
		return "unspecified" // 0.0.0.0 reaches the host itself
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "multicast or broadcast"
	}
	why := ""
	switch {
	case a == netip.AddrFrom4([4]byte{169, 254, 169, 254}) || awsIPv6Md.Contains(a):
		why = "cloud-metadata"
	case a.IsLinkLocalUnicast():
		why = "link-local"
	case a.Is6() && a.IsPrivate():
		why = "unique-local"
	case a.IsPrivate() || sharedNet.Contains(a) || nat64Local.Contains(a):
		why = "private"
	}
	if why != "" && allowPrivate {
		return ""
	}
	return why
}

// control is the dialer's last word before each connect, after DNS: a name
// that resolves to a refused address is refused too, and so is every address
// a happy-eyeballs dial tries.
func (c *config) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot read the address %q", ErrBlockedAddress, address)
	}
	if why := classify(ap.Addr(), c.AllowLoopback, c.AllowPrivate); why != "" {
		return &BlockedAddressError{Addr: ap.Addr().Unmap(), Why: why}
	}
	return nil
}

// dialer dials through the guard.
func (c *config) dialer() *net.Dialer {
	return &net.Dialer{Timeout: c.Timeout, KeepAlive: 30e9, Control: c.control}
}
