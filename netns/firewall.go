package netns

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// tableName is the nftables table (family inet) in every sandbox namespace.
const tableName = "ephemeral"

const dnsPort = 53

// The base chains; every one of them drops what no rule accepts.
var baseChains = []struct {
	name string
	hook *nftables.ChainHook
}{
	{"input", nftables.ChainHookInput},
	{"forward", nftables.ChainHookForward},
	{"output", nftables.ChainHookOutput},
}

// Category groups the counted drop rules.
type category string

const (
	categoryIPv6   category = "ipv6"
	categoryDNS    category = "dns"
	categoryOther  category = "other"
	categoryBroker category = "broker" // the accept rules; not counted
)

// ruleSpec is one rule before it is bound to a table: the unit the pure rule
// builder produces and tests inspect.
type ruleSpec struct {
	chain string
	// comment is "<category>: <description>". It is stored as the rule's
	// nft comment, names the rule when Set compares the installed table
	// with the wanted one, and keys its counter across rebuilds.
	comment string
	exprs   []expr.Any
}

// categoryOf is the category a rule's comment starts with.
func categoryOf(comment string) category {
	c, _, _ := strings.Cut(comment, ":")
	return category(c)
}

// rules builds the table's rules for cfg, in order, chain by chain. Each
// chain drops IPv6 and DNS with counters, then (broker mode) accepts the
// broker connection, then counts and drops everything else; the chain
// policy drop is only a backstop behind that last rule.
func rules(cfg Config) []ruleSpec {
	var out []ruleSpec
	for _, c := range baseChains {
		out = append(out,
			ruleSpec{c.name, "ipv6: every IPv6 packet", concat(
				matchByte(expr.MetaKeyNFPROTO, unix.NFPROTO_IPV6), countAndDrop())},
			ruleSpec{c.name, "dns: udp port 53", concat(
				matchByte(expr.MetaKeyL4PROTO, unix.IPPROTO_UDP), matchPort(dportOffset, dnsPort), countAndDrop())},
			ruleSpec{c.name, "dns: tcp port 53", concat(
				matchByte(expr.MetaKeyL4PROTO, unix.IPPROTO_TCP), matchPort(dportOffset, dnsPort), countAndDrop())},
		)
		if cfg.Mode == Broker {
			if r, ok := brokerRule(c.name, cfg.BrokerPort); ok {
				out = append(out, r)
			}
		}
		out = append(out, ruleSpec{c.name, "other: everything else", countAndDrop()})
	}
	return out
}

// brokerRule accepts the guest's TCP connection to the broker listener:
// packets from the guest in input, the listener's replies in output. Nothing
// is accepted in forward.
func brokerRule(chain string, port uint16) (ruleSpec, bool) {
	desc := fmt.Sprintf("broker: tcp %s -> %s:%d", GuestAddr, GatewayAddr, port)
	switch chain {
	case "input":
		return ruleSpec{chain, desc, concat(
			matchIfname(expr.MetaKeyIIFNAME, TapName),
			matchByte(expr.MetaKeyNFPROTO, unix.NFPROTO_IPV4),
			matchAddr(saddrOffset, GuestAddr.As4()),
			matchAddr(daddrOffset, GatewayAddr.As4()),
			matchByte(expr.MetaKeyL4PROTO, unix.IPPROTO_TCP),
			matchPort(dportOffset, port),
			[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}},
		)}, true
	case "output":
		return ruleSpec{chain, desc, concat(
			matchIfname(expr.MetaKeyOIFNAME, TapName),
			matchByte(expr.MetaKeyNFPROTO, unix.NFPROTO_IPV4),
			matchAddr(saddrOffset, GatewayAddr.As4()),
			matchAddr(daddrOffset, GuestAddr.As4()),
			matchByte(expr.MetaKeyL4PROTO, unix.IPPROTO_TCP),
			matchPort(sportOffset, port),
			// Only replies: the listener never opens a connection to the guest.
			matchCtEstablished(),
			[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}},
		)}, true
	}
	return ruleSpec{}, false
}

// Header offsets: IPv4 addresses in the network header, ports in the
// transport header (same place for TCP and UDP).
const (
	saddrOffset = 12
	daddrOffset = 16
	sportOffset = 0
	dportOffset = 2
)

func concat(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }

func countAndDrop() []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
}

func matchByte(key expr.MetaKey, v byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{v}},
	}
}

func matchIfname(key expr.MetaKey, name string) []expr.Any {
	data := make([]byte, unix.IFNAMSIZ)
	copy(data, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}
}

func matchAddr(offset uint32, addr [4]byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
	}
}

func matchPort(offset uint32, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

func matchCtEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED),
			Xor:  make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// installedRule is a rule as read back from the kernel.
type installedRule struct {
	chain   string
	comment string
	counter *expr.Counter // nil for rules without one
	handle  uint64
}

func (r installedRule) key() string { return r.chain + "\x00" + r.comment }

// readTable returns the table's rules in chain order, and whether the three
// base chains exist as Set builds them. A missing table reads as no rules.
func readTable(conn *nftables.Conn) (_ []installedRule, chainsOK bool, _ error) {
	table := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, false, fmt.Errorf("list chains: %w", err)
	}
	var ours []*nftables.Chain
	for _, c := range chains {
		if c.Table.Name == tableName {
			ours = append(ours, c)
		}
	}
	chainsOK = len(ours) == len(baseChains)
	var out []installedRule
	for _, want := range baseChains {
		i := slices.IndexFunc(ours, func(c *nftables.Chain) bool { return c.Name == want.name })
		if i < 0 {
			chainsOK = false
			continue
		}
		c := ours[i]
		if c.Hooknum == nil || *c.Hooknum != *want.hook || c.Policy == nil || *c.Policy != nftables.ChainPolicyDrop {
			chainsOK = false
		}
		rs, err := conn.GetRules(table, c)
		if err != nil {
			return nil, false, fmt.Errorf("list rules of %s: %w", c.Name, err)
		}
		for _, r := range rs {
			comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			ir := installedRule{chain: c.Name, comment: comment, handle: r.Handle}
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					ir.counter = ctr
				}
			}
			out = append(out, ir)
		}
	}
	return out, chainsOK, nil
}

// upToDate reports whether the installed rules are exactly the wanted ones,
// compared by chain and comment (which carries the mode and port).
func upToDate(installed []installedRule, chainsOK bool, want []ruleSpec) bool {
	if !chainsOK || len(installed) != len(want) {
		return false
	}
	for i, r := range want {
		if installed[i].chain != r.chain || installed[i].comment != r.comment {
			return false
		}
	}
	return true
}

// Set applies cfg to the namespace's firewall. If the installed table
// already matches it changes nothing. Otherwise it replaces the whole table
// in one atomic batch, carrying each drop counter over to its successor.
func (n *Network) Set(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return fmt.Errorf("netns: set firewall of %s: network closed", n.id)
	}
	if err := setFirewall(n.nft, cfg); err != nil {
		return fmt.Errorf("netns: set firewall of %s: %w", n.id, err)
	}
	return nil
}

func setFirewall(conn *nftables.Conn, cfg Config) error {
	want := rules(cfg)
	installed, chainsOK, err := readTable(conn)
	if err != nil {
		return err
	}
	if upToDate(installed, chainsOK, want) {
		return nil
	}
	counters := make(map[string]*expr.Counter)
	for _, r := range installed {
		if r.counter != nil {
			counters[r.key()] = r.counter
		}
	}

	table := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	// Adding before deleting makes the delete valid when the table does not
	// exist yet; the batch is one transaction, so no packet sees a gap.
	conn.AddTable(table)
	conn.DelTable(table)
	conn.AddTable(table)
	chains := make(map[string]*nftables.Chain)
	for _, c := range baseChains {
		chains[c.name] = conn.AddChain(&nftables.Chain{
			Name:     c.name,
			Table:    table,
			Hooknum:  c.hook,
			Priority: nftables.ChainPriorityFilter,
			Type:     nftables.ChainTypeFilter,
			Policy:   ptr(nftables.ChainPolicyDrop),
		})
	}
	for _, r := range want {
		exprs := slices.Clone(r.exprs)
		for i, e := range exprs {
			if _, ok := e.(*expr.Counter); ok {
				if old := counters[installedRule{chain: r.chain, comment: r.comment}.key()]; old != nil {
					exprs[i] = &expr.Counter{Bytes: old.Bytes, Packets: old.Packets}
				}
			}
		}
		conn.AddRule(&nftables.Rule{
			Table:    table,
			Chain:    chains[r.chain],
			Exprs:    exprs,
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment),
		})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("apply table %s: %w", tableName, err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// Counter is what one class of drop rules has matched.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

// Counters are the drop counters of a sandbox's firewall, summed over the
// input, forward and output chains.
type Counters struct {
	IPv6  Counter // any IPv6 packet
	DNS   Counter // TCP or UDP to port 53
	Other Counter // everything else not accepted
}

// Total is the sum over all drop rules: anything above zero means the
// guest (or something in the namespace) tried to send what it may not.
func (c Counters) Total() Counter {
	return Counter{
		Packets: c.IPv6.Packets + c.DNS.Packets + c.Other.Packets,
		Bytes:   c.IPv6.Bytes + c.DNS.Bytes + c.Other.Bytes,
	}
}

// Counters reads the drop counters from the kernel.
func (n *Network) Counters() (Counters, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return Counters{}, fmt.Errorf("netns: counters of %s: network closed", n.id)
	}
	installed, _, err := readTable(n.nft)
	if err != nil {
		return Counters{}, fmt.Errorf("netns: counters of %s: %w", n.id, err)
	}
	return sumCounters(installed)
}

func sumCounters(installed []installedRule) (Counters, error) {
	var c Counters
	for _, r := range installed {
		if r.counter == nil {
			continue
		}
		var dst *Counter
		switch categoryOf(r.comment) {
		case categoryIPv6:
			dst = &c.IPv6
		case categoryDNS:
			dst = &c.DNS
		case categoryOther:
			dst = &c.Other
		default:
			return Counters{}, fmt.Errorf("netns: counted rule with unknown comment %q", r.comment)
		}
		dst.Packets += r.counter.Packets
		dst.Bytes += r.counter.Bytes
	}
	return c, nil
}
